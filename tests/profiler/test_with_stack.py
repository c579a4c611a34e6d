"""``with_stack=True`` as torch.profiler gives it: the same Python calls (C functions and nn.Modules
included), the same names and ids in the trace, the same call tree with torch's PyCall fields, and
stacks only where torch gives them (``verbose``). Each test runs the same code under torch.profiler and
polyprof.profiler and compares."""

import gc
import json
import re
import threading

import pytest

from polyprof._native import extension as speedups

torch = pytest.importorskip("torch", reason="needs torch (CPU build) to compare with torch.profiler")
pytestmark = pytest.mark.skipif(speedups is None, reason="needs polyprof's C extension (the Python tracer is C)")

from torch._C._profiler import _ExperimentalConfig, _ExtraFields_PyCall, _ExtraFields_PyCCall  # noqa: E402

import polyprof.profiler  # noqa: E402

ADDRESS = re.compile(r"object at 0x[0-9a-f]+>")
LINE = re.compile(r"\(\d+\): ")


def workload():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.rand(2, 8)

    def forward():
        return model(x).sum()

    return forward


def normal(name: str) -> str:
    return ADDRESS.sub("object at 0x>", name)


def user_subtree(roots, marker):
    """The calls under the frame named `marker` (this module's function that runs the workload),
    normalised, as nested (name, children) tuples: the profilers' own frames are outside it."""

    def find(nodes):
        for n in nodes:
            if marker in n.name:
                return n
            hit = find(n.children)
            if hit is not None:
                return hit
        return None

    def shape(node):
        return (normal(node.name), tuple(shape(c) for c in node.children))

    found = find(roots)
    assert found is not None, f"no {marker} frame in the tree"
    return shape(found)


def run_profiled(module, **kwargs):
    forward = workload()
    forward()  # warm up (first-call imports and caches)

    def run_workload():
        return forward()

    gc.disable()  # (a collection inside would put the gc callbacks of whoever registered one in the tree)
    try:
        with module.profile(with_stack=True, **kwargs) as prof:
            run_workload()
    finally:
        gc.enable()
    return prof


def test_the_call_tree_is_torchs_with_pycall_fields():
    torch_prof = run_profiled(torch.profiler)
    ours = run_profiled(polyprof.profiler)
    torch_tree = user_subtree(torch_prof.profiler.kineto_results.experimental_event_tree(), "run_workload")
    our_roots = ours.profiler.kineto_results.experimental_event_tree()
    assert user_subtree(our_roots, "run_workload") == torch_tree
    flat = []
    todo = list(our_roots)
    while todo:
        node = todo.pop()
        flat.append(node)
        todo.extend(node.children)
    calls = [n for n in flat if isinstance(n.extra_fields, _ExtraFields_PyCall)]
    c_calls = [n for n in flat if isinstance(n.extra_fields, _ExtraFields_PyCCall)]
    assert calls and c_calls
    modules = [n for n in calls if n.name.startswith("nn.Module: ")]
    assert {n.name for n in modules} == {"nn.Module: Sequential_0", "nn.Module: Linear_0", "nn.Module: ReLU_0"}
    assert {n.extra_fields.module.cls_name for n in modules} == {"Sequential", "Linear", "ReLU"}
    for node in calls + c_calls:  # the lineage the tree shows is the caller the tracer recorded
        parent = node.parent
        while parent is not None and not isinstance(parent.extra_fields, _ExtraFields_PyCall):
            parent = parent.parent
        if parent is not None and not node.name.startswith("nn.Module"):
            site = parent.extra_fields.callsite
            assert (site.file_name, site.function_name) == (
                node.extra_fields.caller.file_name,
                node.extra_fields.caller.function_name,
            ), node.name
    forward = next(n for n in calls if n.name.endswith(": forward") and "linear.py" in n.name)
    assert forward.extra_fields.callsite.file_name == "torch/nn/modules/linear.py"


def python_events(prof, tmp_path, name):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "python_function"], [e for e in events if e.get("cat") == "cpu_op"]


def test_the_trace_has_torchs_python_function_events_and_no_op_stacks(tmp_path):
    torch_py, torch_ops = python_events(run_profiled(torch.profiler), tmp_path, "torch.json")
    our_py, our_ops = python_events(run_profiled(polyprof.profiler), tmp_path, "polyprof.json")

    def names_under(events, marker):
        by_id = {e["args"]["Python id"]: e for e in events}
        top = next(e for e in events if marker in e["name"])

        def under(e):
            while e is not None:
                if e is top:
                    return True
                e = by_id.get(e["args"]["Python parent id"])
            return False

        return sorted(LINE.sub("(): ", normal(e["name"])) for e in events if under(e) and e is not top)

    assert names_under(our_py, "run_workload") == names_under(torch_py, "run_workload")
    ids = [e["args"]["Python id"] for e in our_py]
    assert sorted(ids) == list(range(1, len(ids) + 1))
    assert sum(1 for e in our_py if e["args"]["Python parent id"] is None) >= 1
    assert all("Python module id" in e["args"] for e in our_py if e["name"].startswith("nn.Module: "))
    assert not any("Call stack" in e["args"] for e in torch_ops)
    assert not any("Call stack" in e["args"] for e in our_ops), "torch writes no per-op stack without verbose"


def test_with_verbose_each_op_has_torchs_stack(tmp_path):
    config = _ExperimentalConfig(verbose=True)
    stacks = {}
    for module in (torch.profiler, polyprof.profiler):
        prof = run_profiled(module, experimental_config=config)
        linear = next(e for e in prof.events() if e.name == "aten::linear")
        stacks[module.__name__] = [normal(s) for s in linear.stack]
        _, ops = python_events(prof, tmp_path, f"{module.__name__}.json")
        op = next(e for e in ops if e["name"] == "aten::linear")
        assert op["args"]["Call stack"].endswith(";")
        assert [normal(s) for s in op["args"]["Call stack"].split(";")[:-1]] == stacks[module.__name__]
        path = tmp_path / f"{module.__name__}.stacks"
        prof.export_stacks(str(path), "self_cpu_time_total")
        assert "linear.py" in path.read_text()
    ours, theirs = stacks["polyprof.profiler"], stacks["torch.profiler"]
    cut = ours.index(next(s for s in ours if "run_workload" in s))
    assert ours[: cut + 1] == theirs[: theirs.index(next(s for s in theirs if "run_workload" in s)) + 1]
    assert ours[0] == "<built-in function linear>"


def test_threads_started_while_recording_are_not_traced_and_earlier_ones_are():
    """As torch's tracer: every thread there at the start (its open frames from the start), none
    started later (torch cannot hook them either)."""
    started, release = threading.Event(), threading.Event()

    def parked():
        started.set()
        release.wait(10)

    def later():
        sum(range(10))

    early = threading.Thread(target=parked)
    early.start()
    started.wait(10)
    with polyprof.profiler.profile(with_stack=True) as prof:
        late = threading.Thread(target=later)
        late.start()
        late.join()
        release.set()
        early.join()
    tids = {n.start_tid for n in prof.profiler.kineto_results.experimental_event_tree()
            if isinstance(n.extra_fields, _ExtraFields_PyCall)}
    assert early.native_id in tids and threading.get_native_id() in tids
    assert late.native_id not in tids
