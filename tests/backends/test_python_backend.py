"""The python backend: every Python call as a python_function slice, strictly nested per thread."""

import asyncio
import json
import sys
import threading

import numpy as np
import pytest

import polyprof
from polyprof._native import extension as speedups
from polyprof.model import ActivityKind

pytestmark = pytest.mark.skipif(speedups is None, reason="needs polyprof's C extension (the tracer is C)")


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Shape:
    def area(self):
        return 0


class Square(Shape):
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side * super().area() + self.side**2


def _python_rows(prof):
    acts = prof.trace.activities
    keep = acts["kind"] == int(ActivityKind.PYTHON_FUNCTION)
    names = acts.names()[keep]
    return names, acts["start"][keep], acts["end"][keep], acts["resource"][keep]


def _strictly_nested(starts, ends):
    order = np.lexsort((-ends, starts))
    stack = []
    for s, e in zip(starts[order].tolist(), ends[order].tolist(), strict=True):
        while stack and s >= stack[-1]:
            stack.pop()
        if stack and e > stack[-1]:
            return False
        stack.append(e)
    return True


def test_every_call_on_every_thread_nested_and_named_as_torch_does():
    with polyprof.profile(["cpu", "python"]) as prof:
        with polyprof.record_function("region"):
            fib(10)
            Square(3).area()
        worker = threading.Thread(target=fib, args=(6,), name="worker")
        worker.start()
        worker.join()
    names, starts, ends, rows = _python_rows(prof)
    here = __file__
    assert sum(n == f"{here}({fib.__code__.co_firstlineno}): fib" for n in names) == 177 + 25, "fib(10) and fib(6): every call"
    assert f"{here}({Square.area.__code__.co_firstlineno}): Square.area" in set(names)
    assert f"{here}({Shape.area.__code__.co_firstlineno}): Shape.area" in set(names)
    threads = {prof.trace.resources[r].name for r in set(rows.tolist())}
    assert any("worker" in t for t in threads) and not any("polyprof-" in t for t in threads)
    for r in set(rows.tolist()):
        mine = rows == r
        assert _strictly_nested(starts[mine], ends[mine]), "slices nest per thread (Perfetto drops those that do not)"
    acts = prof.trace.activities
    region = np.flatnonzero(acts.names() == "region")[0]
    inside = (starts >= acts["start"][region]) & (ends <= acts["end"][region]) & (rows == acts["resource"][region])
    assert inside.sum() >= 177 + 3, "on the same thread row as the annotation, inside it"
    assert not any("polyprof/" in str(n) for n in names), "polyprof's own frames are not traced"


def test_it_is_never_on_unless_asked_for():
    with polyprof.profile() as prof:
        fib(5)
    assert "python" not in prof.backends
    assert not (prof.trace.activities["kind"] == int(ActivityKind.PYTHON_FUNCTION)).any()


# a new thread's first traced frame: its target on 3.10/3.11 (the profile hook is set inside threading's
# bootstrap), threading's bootstrap itself on 3.12+ (sys.monitoring sees every frame): depth counts them
THREAD_BASE = 3 if sys.version_info >= (3, 12) else 0


def test_filters_depth_duration_c_calls_and_folding():
    opts = {"python": {"max_depth": THREAD_BASE + 3, "c_calls": True}}
    with polyprof.profile(["python"], backend_options=opts) as prof:
        worker = threading.Thread(target=fib, args=(8,))  # a fresh stack: fib is its first traced call
        worker.start()
        worker.join()
        len([1, 2])
        json.dumps({"a": [1, 2, 3]})
    names = list(_python_rows(prof)[0])
    assert sum("): fib" in n for n in names) == 1 + 2 + 4, "fib at the first three depths of the thread's stack"
    assert "<built-in method len>" not in names, "the test's own frames are deeper"
    status = prof.trace.backends["python"]
    assert status.dropped["by option: python frames deeper than max_depth"] > 0
    with polyprof.profile(["python"], backend_options={"python": {"c_calls": True}}) as prof:
        len([1, 2])
        json.dumps({"a": [1, 2, 3]})
    names = list(_python_rows(prof)[0])
    assert "<built-in method len>" in names
    dumps = [n for n in names if n.endswith(": dumps")]
    assert len(dumps) == 1 and not any("json/encoder.py" in n for n in names), "a library call is one slice"
    with polyprof.profile(["python"], backend_options={"python": {"fold_libraries": False}}) as prof:
        json.dumps({"a": [1, 2, 3]})
    assert any("json/encoder.py" in n for n in _python_rows(prof)[0]), "unfolded, the library's own calls show"
    with polyprof.profile(["python"], backend_options={"python": {"min_duration_us": 1000}}) as prof:
        fib(8)
    assert not any("): fib" in n for n in _python_rows(prof)[0])
    assert prof.trace.backends["python"].dropped["by option: python calls shorter than min_duration_us"] >= 67
    with polyprof.profile(["python"], backend_options={"python": {"exclude": ["*Shape*"]}}) as prof:
        Square(2).area()
    names = set(_python_rows(prof)[0])
    assert any(n.endswith("Square.area") for n in names) and not any(n.endswith("Shape.area") for n in names)


def test_user_code_called_back_by_a_library_is_kept():
    def key(x):
        return -x

    with polyprof.profile(["python"]) as prof:
        sorted([3, 1, 2], key=key)  # C calls back user code
        asyncio.run(asyncio.sleep(0))  # the stdlib: folded
    names = list(_python_rows(prof)[0])
    assert sum(n.endswith("key") for n in names) == 3
    assert sum("asyncio" in n for n in names) <= 2, "asyncio.run and its internals fold into a slice or two"


def test_coroutines_are_one_slice_per_resumption_and_nest():
    async def step(n):
        for _ in range(3):
            await asyncio.sleep(0)
            fib(n)

    async def main():
        await asyncio.gather(step(4), step(5))

    with polyprof.profile(["python"], backend_options={"python": {"fold_libraries": False}}) as prof:
        asyncio.run(main())
    names, starts, ends, rows = _python_rows(prof)
    assert sum(n.endswith("step") for n in names) == 8, "each task: started, resumed three times"
    assert _strictly_nested(starts, ends)


def test_frames_open_at_the_start_are_slices_until_they_return_or_the_stop():
    release = threading.Event()

    def parked():
        release.wait()

    worker = threading.Thread(target=parked, name="parked")
    worker.start()
    try:
        with polyprof.profile(["python"]) as prof:
            fib(3)
    finally:
        release.set()
        worker.join()
    names, starts, ends, rows = _python_rows(prof)
    here = [n for n in names if n.endswith("test_frames_open_at_the_start_are_slices_until_they_return_or_the_stop")]
    assert len(here) == 1, "this test's frame, open all along, ends at the stop"
    assert any(n.endswith(".parked") for n in names), "a parked thread's open frames are on its row"
    for r in set(rows.tolist()):
        assert _strictly_nested(starts[rows == r], ends[rows == r])


def test_another_tools_profile_hook_is_given_back():
    calls = []

    def other(frame, event, arg):
        calls.append(event)

    threading.setprofile(other)
    try:
        with polyprof.profile(["python"]):
            fib(3)
        assert threading.getprofile() is other
    finally:
        threading.setprofile(None)
    assert sys.getprofile() is None


def test_python_calls_of_a_script_that_imports_torch_are_recorded_under_polyprof_run(tmp_path):
    """`polyprof run --activities cpu,python` on a torch script: its un-annotated functions are in the
    trace, and no call is left unnamed (importing torch makes methods whose code objects compare equal:
    the tracer kept one of each, and the rows naming the others were lost)."""
    import subprocess
    import sys

    pytest.importorskip("torch", reason="needs torch: the failure came with `import torch`")
    script = tmp_path / "slow.py"
    script.write_text("import time, torch\n"
                      "def slow_function():\n    t = time.time()\n    while time.time() - t < 0.02:\n        sum(range(100))\n"
                      "for i in range(3):\n    torch.ones(4).add(1)\n    slow_function()\n")
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "--no-summary", "--activities", "cpu,python", "-o",
                        str(tmp_path / "t.json"), str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "raised" not in r.stderr, r.stderr[-3000:]
    trace = polyprof.load_trace(str(tmp_path / "t.json"))
    assert sum(a.name.endswith(": slow_function") for a in trace.activities) == 3
    assert not any("code object" in why for why in trace.backends["python"].dropped), trace.backends["python"].dropped


def test_calls_of_code_objects_that_compare_equal_are_each_named():
    """Two functions compiled from the same source (as dataclasses and namedtuple make their methods) have
    code objects that are equal but not the same: each call is a row with its name, the second one's
    code object freed before the stop included."""
    source = compile("def twin():\n    return sum(range(10))\n", "twins.py", "exec")
    first, second = {}, {}
    exec(source, first)
    exec(compile("def twin():\n    return sum(range(10))\n", "twins.py", "exec"), second)
    assert first["twin"].__code__ == second["twin"].__code__ and first["twin"].__code__ is not second["twin"].__code__
    with polyprof.profile(["python"], backend_options={"python": {"min_duration_us": 0}}) as prof:
        first["twin"]()
        second["twin"]()
        del second  # the only reference to the second code object, but the rows'
    names = [a.name for a in prof.trace.activities if a.name.endswith(": twin")]
    assert names == ["twins.py(1): twin"] * 2, names
    assert not any("code object" in why for why in prof.trace.backends["python"].dropped)
