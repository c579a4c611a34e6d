"""The C hot path and the pure-Python one record the same events."""

import json
import os
import subprocess
import sys

import pytest

from polyprof._native import BUILT_HERE
from polyprof._native import extension as speedups

SCRIPT = r"""
import asyncio, json, threading, polyprof
from polyprof._native import extension as speedups
from polyprof.model import ActivityKind
with polyprof.profile(["cpu"]) as prof:
    with polyprof.record_function("outer", {"a": 1}):
        with polyprof.record_function("inner", "s"):
            polyprof.instant("mark")
        polyprof.counter("c", 2)
    t = threading.Thread(target=lambda: polyprof.record_function("thr").__enter__().__exit__(None, None, None))
    t.start(); t.join()
    @polyprof.record_function("deco")
    def f(n):
        return n if n == 0 else f(n - 1)
    f(2)
acts = list(prof.trace.activities)
ids = {a.name: a.correlation for a in acts if a.kind == ActivityKind.USER_ANNOTATION}
out = [(a.name, int(a.kind), a.args, a.external_id == (ids.get("inner") if a.name == "mark" else a.correlation)) for a in acts]
print(json.dumps({"accel": speedups is not None, "rows": out, "counters": [s.value for s in prof.trace.counters.samples]}))
"""


def run(pure):
    env = {**os.environ, "POLYPROF_PURE_PYTHON": "1" if pure else "0"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout)


@pytest.mark.skipif(
    speedups is None, reason="the C extension is not built here, so there is nothing to compare"
)
def test_c_and_python_hot_paths_record_the_same_events():
    c, py = run(False), run(True)
    assert c["accel"] and not py["accel"]
    key = lambda rows: sorted(map(json.dumps, rows))  # noqa: E731
    assert key(c["rows"]) == key(py["rows"])
    assert c["counters"] == py["counters"] == [2.0]
    names = sorted(r[0] for r in c["rows"])
    assert names == ["deco", "deco", "deco", "inner", "mark", "outer", "thr"]
    assert all(r[3] for r in c["rows"]), "External ids point at the right spans"


@pytest.mark.skipif(speedups is None, reason="the C extension is not built here, so there is nothing to compare")
def test_c_record_function_is_built_as_the_python_one_is():
    """The C type is constructed without type.__call__ (vectorcall): the same arguments give the same
    span, the same bad ones the same TypeError, and subclasses and the decorator work as with the
    pure-Python class."""
    import polyprof
    from polyprof import annotations
    from polyprof._native.twins.recorder import RecordFunction as _PyRecordFunction

    c_type = polyprof.record_function
    assert c_type is speedups.RecordFunction and c_type.__doc__ == annotations._DOC
    for args, kwargs in [(("x",), {}), (("x", {"a": 1}), {}), (("x",), {"args": "s"}), ((), {"name": "x", "args": None})]:
        c, py = c_type(*args, **kwargs), _PyRecordFunction(*args, **kwargs)
        assert (c.name, c.args) == (py.name, py.args)
    for args, kwargs in [((), {}), (("a", "b", "c"), {}), (("a",), {"foo": 1}), (("a",), {"name": "b"})]:
        for cls in (c_type, _PyRecordFunction):
            with pytest.raises(TypeError):
                cls(*args, **kwargs)

    class Step(c_type):
        def __init__(self, n: int) -> None:
            super().__init__(f"step {n}", {"n": n})

    @c_type("decorated")
    def work() -> int:
        with Step(3):
            return 7

    with polyprof.profile(["cpu"]) as prof:
        assert work() == 7
    spans = {a.name: a for a in prof.trace.activities}
    assert spans["step 3"].args == {"n": 3} and type(Step(1)) is Step
    assert spans["decorated"].start <= spans["step 3"].start <= spans["step 3"].end <= spans["decorated"].end


def _decorated_module_function(x: int, *, y: int = 1) -> int:
    """Doc of the decorated function."""
    return x + y


@pytest.mark.skipif(speedups is None, reason="the C decorator exists only with the C extension")
def test_the_c_decorator_behaves_as_the_python_wrapper_did():
    """@record_function on a plain function wraps it in C (SpanCall): the function's name, doc,
    signature and __wrapped__; methods bind; an exception propagates with the span closed; recursion
    gets a span per call; it pickles by name like the function."""
    import inspect
    import pickle

    import polyprof

    global _decorated_module_function
    plain = _decorated_module_function
    _decorated_module_function = polyprof.record_function("module fn")(plain)
    try:
        wrapped = _decorated_module_function
        assert type(wrapped) is speedups.SpanCall and wrapped.__wrapped__ is plain
        assert (wrapped.__name__, wrapped.__doc__) == (plain.__name__, plain.__doc__)
        assert inspect.signature(wrapped) == inspect.signature(plain)
        assert pickle.loads(pickle.dumps(wrapped)) is wrapped

        class Model:
            @polyprof.record_function("method")
            def step(self, k):
                return self, k

        @polyprof.record_function("fails")
        def fails():
            raise KeyError("boom")

        @polyprof.record_function("fib")
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)

        model = Model()
        with polyprof.profile(["cpu"]) as prof:
            assert wrapped(1, y=2) == 3 and model.step(5) == (model, 5) and Model.step(model, 6) == (model, 6)
            with pytest.raises(KeyError, match="boom"):
                fails()
            assert fib(5) == 5
        names = [a.name for a in prof.trace.activities]
        assert names.count("method") == 2 and names.count("fails") == 1 and names.count("fib") == 15
        failed = next(a for a in prof.trace.activities if a.name == "fails")
        assert failed.end >= failed.start and "finished" not in (failed.args or {})
    finally:
        _decorated_module_function = plain


def test_the_engines_span_tests_pass_on_the_pure_python_path():
    """The pure-Python recorder keeps open spans as placeholders in the thread's event list: the
    engine's tests of spans open at a stop, across flushes, closing while the profile stops, from
    threads and asyncio tasks, run again on it (the suite itself runs on the C path where it is built)."""
    from pathlib import Path

    tests = Path(__file__).parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests / "engine" / "test_engine.py"), "-k",
         "span or annotation or flush"],
        capture_output=True, text=True, env={**os.environ, "POLYPROF_PURE_PYTHON": "1"}, cwd=tests.parent,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "deselected" in r.stdout


BRIDGE_SCRIPT = r"""
import json, polyprof
from polyprof import annotations
class Bridge(annotations.FrameworkBridge):
    def __init__(self):
        self.calls = []
    def consumers(self):
        return True
    def enter(self, name, text):
        self.calls.append(["enter", name, text])
        return name, 7
    def exit(self, rng):
        self.calls.append(["exit", rng])
bridge = Bridge()
annotations.set_framework_bridge(bridge)
@polyprof.record_function("deco", {"a": 1})
def f():
    return 5
assert f() == 5
with polyprof.profile(["cpu"]) as prof:
    assert f() == 5
annotations.set_framework_bridge(None)
with polyprof.profile(["cpu"]) as changed:
    assert f() == 5
    annotations.set_framework_bridge(bridge)  # (torch imported while recording)
    assert f() == 5
    annotations.set_framework_bridge(None)
    assert f() == 5
print(json.dumps({"calls": bridge.calls, "args": [a.args for a in prof.trace.activities],
                  "changed": [a.args for a in changed.trace.activities]}))
"""


def test_a_pure_python_decorated_call_is_a_framework_range_while_a_bridge_is_installed():
    """The pure-Python decorator inlines a span only while it is no more than its event: with a bridge
    to a framework's ranges (torch's, once torch is imported) each call is also that framework's range,
    in a profile or not, and the span carries the range's handle; with the bridge removed, not; and a
    bridge installed or removed while recording counts from the next call."""
    env = {**os.environ, "POLYPROF_PURE_PYTHON": "1"}
    r = subprocess.run([sys.executable, "-c", BRIDGE_SCRIPT], capture_output=True, text=True, env=env, check=True)
    out = json.loads(r.stdout)
    assert out["calls"] == [["enter", "deco", '{"a": 1}'], ["exit", "deco"]] * 3
    ranged, not_ranged = {"a": 1, "Record function id": 7}, {"a": 1, "Record function id": 0}
    assert out["args"] == [ranged] and out["changed"] == [not_ranged, ranged, not_ranged]


def test_a_traceback_through_the_pure_python_decorator_shows_the_wrappers_lines():
    """The pure-Python wrapper is compiled from source; a traceback through it shows its line."""
    import functools
    import traceback

    from polyprof._native.twins.recorder import SpanCall

    def fails(x, *, y=1):
        raise ValueError(x + y)

    wrapped = functools.update_wrapper(SpanCall(fails, "fails", None), fails)
    with pytest.raises(ValueError) as caught:
        wrapped(1, y=2)
    text = "".join(traceback.format_exception(caught.value))
    assert "return span_fn(x, y=y)" in text and "raise ValueError(x + y)" in text


RECORDER_SCRIPT = r"""
import json, sys
if sys.argv[1] == "missing":
    sys.modules["polyprof._native._speedups"] = None  # the import fails as it does where the extension was not built
import polyprof
from polyprof.engine.registry import default
with polyprof.profile(["cpu"]) as prof:
    with polyprof.record_function("kept"):
        pass
prof.export_chrome_trace(sys.argv[2])
back = polyprof.load_trace(sys.argv[2]).backends["host"]
probes = {e.name: default.probe(e) for e in default.entries() if e.name in ("host", "python")}
print(json.dumps({
    "spans": [a.name for a in prof.trace.activities],
    "recorder": back.details.get("recorder"), "warnings": back.warnings,
    "probe": dict(probes["host"].versions),
    "python_backend": [probes["python"].available, probes["python"].reason],
}))
"""


def recorder_run(case, tmp_path):
    env = {**os.environ, "POLYPROF_PURE_PYTHON": "1" if case == "forced" else "0"}
    path = str(tmp_path / f"{case}.json")
    r = subprocess.run([sys.executable, "-c", RECORDER_SCRIPT, case, path], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(speedups is None, reason="the C extension is not built here: the C recorder cannot be in use")
def test_the_c_recorder_is_named_in_the_backend_list_and_the_trace(tmp_path):
    out = recorder_run("built", tmp_path)
    assert out["recorder"] == out["probe"]["recorder"] == "C (polyprof._native._speedups)"
    assert out["warnings"] == [] and out["spans"] == ["kept"]
    assert out["python_backend"][0]


def test_a_pure_python_recorder_chosen_by_the_user_is_named_without_a_warning(tmp_path):
    out = recorder_run("forced", tmp_path)
    assert out["recorder"] == out["probe"]["recorder"] == "pure Python (POLYPROF_PURE_PYTHON is set; unset it for the C recorder)"
    assert out["warnings"] == [] and out["spans"] == ["kept"]
    assert out["python_backend"] == [False, "the Python call tracer needs polyprof's C extension, not in use here: "
                                            "POLYPROF_PURE_PYTHON is set; unset it for the C recorder"]


@pytest.mark.skipif(not BUILT_HERE, reason="the C extension is built for CPython on Linux only: elsewhere its absence is expected")
def test_a_c_extension_that_does_not_load_is_told_in_the_trace_with_the_fix(tmp_path):
    """Installation succeeds without a compiler (the extension is optional), so the user learns of the
    slower recorder from polyprof backends and from each trace: the reason, and how to get the C one."""
    out = recorder_run("missing", tmp_path)
    assert out["spans"] == ["kept"], "the profile still records"
    recorder = out["recorder"]
    assert recorder == out["probe"]["recorder"]
    assert recorder.startswith("pure Python (polyprof's C extension did not load (import of polyprof._native._speedups halted")
    assert "apt install gcc python3-dev), reinstall polyprof to build it" in recorder
    [warning] = out["warnings"]
    assert warning.startswith("spans, instants and counters cost several times more: polyprof's C extension did not load")
    assert out["python_backend"][0] is False and "reinstall polyprof" in out["python_backend"][1]
