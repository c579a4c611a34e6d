"""polyprof.profiler as a drop-in for torch.profiler: the profile object's torch-side API, every option
doing what torch's does, and polyprof annotations seen by torch-side consumers. Each test is a behaviour
PyTorch's own profiler tests showed missing (see BENCHMARKS.md, "PyTorch's profiler tests")."""

import gzip
import json
import logging
import os
import warnings

import pytest

torch = pytest.importorskip("torch", reason="needs torch (CPU build): these are torch.profiler's behaviours")

import polyprof  # noqa: E402
from polyprof.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule  # noqa: E402
from polyprof.torch import observer  # noqa: E402

try:
    observer.get(torch)
    BUILD_PROBLEM = ""
except observer.BuildError as exc:
    BUILD_PROBLEM = str(exc)
needs_observer = pytest.mark.skipif(bool(BUILD_PROBLEM), reason=f"the observer cannot be built: {BUILD_PROBLEM}")
ExperimentalConfig = torch._C._profiler._ExperimentalConfig


def trace_json(prof, tmp_path, name="t.json"):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def events_named(doc, name):
    return [e for e in doc["traceEvents"] if e.get("name") == name]


def test_torch_profiler_names_import_from_polyprof_profiler():
    from polyprof.profiler import (
        DeviceType,
        ExecutionTraceObserver,
        KinetoStepTracker,
        _ExperimentalConfig,
        _utils,
        itt,
        kineto_available,
        supported_activities,
    )

    assert DeviceType is torch.autograd.DeviceType
    assert ExecutionTraceObserver is torch.profiler.ExecutionTraceObserver
    assert _ExperimentalConfig is ExperimentalConfig
    assert _utils is torch.profiler._utils and itt is torch.profiler.itt
    assert KinetoStepTracker is torch.autograd.profiler.KinetoStepTracker
    assert kineto_available() and ProfilerActivity.CPU in supported_activities()
    with pytest.raises(ImportError, match="not_a_name"):
        from polyprof.profiler import not_a_name  # noqa: F401


def test_profiler_action_members_equal_torchs():
    assert ProfilerAction.RECORD == torch.profiler.ProfilerAction.RECORD
    assert torch.profiler.ProfilerAction.WARMUP == ProfilerAction.WARMUP
    assert ProfilerAction.NONE != torch.profiler.ProfilerAction.RECORD
    sched = torch.profiler.schedule(wait=1, warmup=1, active=1)
    assert [sched(i) for i in range(3)] == [ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD_AND_SAVE]
    with pytest.raises(ValueError, match="DEVICE_STOPPED"):
        profile(activities=["cpu"], schedule=lambda step: ProfilerAction.DEVICE_STOPPED).start()


@needs_observer
def test_torch_sees_a_kineto_profiler_while_polyprof_records():
    types = torch._C._profiler.ActiveProfilerType
    assert torch._C._autograd._profiler_type() == types.NONE
    with profile(activities=[ProfilerActivity.CPU]):
        assert torch._C._autograd._profiler_type() == types.KINETO
        assert torch.autograd._profiler_enabled() and torch.autograd.profiler._is_profiler_enabled
    assert torch._C._autograd._profiler_type() == types.NONE
    assert not torch.autograd.profiler._is_profiler_enabled


@needs_observer
def test_record_function_fast_ranges_and_their_kwargs_as_kineto_writes_them(tmp_path):
    x, y = torch.rand(4, 4), torch.rand(4, 4)
    kwargs = {"stream": 0, "grid": "lambda x : x + 1", "debug": 'de"bug', "flag": True, "names": ["a", "b"],
              "ints": [1, 2], "path": "a\\b\nc"}
    with profile(record_shapes=True) as prof:
        with torch._C._profiler._RecordFunctionFast("fast_rf", [x, y], kwargs):
            x.add(y)
        with torch._C._profiler._RecordFunctionFast("scoped", [x], {"stream": "s", "scope": "user_scope"}):
            x.add(y)
    doc = trace_json(prof, tmp_path)
    (fast,) = events_named(doc, "fast_rf")
    assert fast["cat"] == "cpu_op" and fast["args"]["Input Dims"] == [[4, 4], [4, 4]]
    args = fast["args"]
    assert (args["stream"], args["grid"], args["debug"], args["flag"]) == (0, "lambda x : x + 1", "None", True)
    assert args["names"] == ["a", "b"] and args["path"] == "a/bc" and "ints" not in args
    (scoped,) = events_named(doc, "scoped")
    assert scoped["cat"] == "user_annotation" and "stream" not in scoped["args"]
    (event,) = [e for e in prof.events() if e.name == "fast_rf"]
    assert event.input_shapes == [[4, 4], [4, 4]] and event.kwinputs["grid"] == "lambda x : x + 1"


@needs_observer
def test_profile_memory_rows_and_columns(tmp_path):
    with profile(profile_memory=True, record_shapes=True) as prof:
        with record_function("alloc"):
            x = torch.rand(100, 100)
        with record_function("free"):
            del x
    memory = events_named(trace_json(prof, tmp_path), "[memory]")
    assert memory and all({"Addr", "Device Type", "Device Id", "Bytes", "Total Allocated"} <= set(e["args"]) for e in memory)
    assert memory[0]["ph"] == "i" and memory[0]["args"]["Bytes"] == 40_000
    stats = {e.key: e for e in prof.key_averages()}
    assert stats["alloc"].cpu_memory_usage == 40_000 and stats["free"].cpu_memory_usage == -40_000
    assert stats["aten::empty"].self_cpu_memory_usage == 40_000
    assert "CPU Mem" in prof.key_averages().table(row_limit=-1)
    assert prof.trace.backends["torch"].details["recorder"] == "polyprof observer"


@needs_observer
def test_with_flops_and_overload_names():
    a = torch.rand(32, 32)
    with profile(with_flops=True) as prof:
        torch.mm(a, a)
    (mm,) = [e for e in prof.events() if e.name == "aten::mm"]
    assert mm.flops == 2 * 32**3
    assert "FLOPs" in prof.key_averages().table(row_limit=-1)

    config = ExperimentalConfig(capture_overload_names=True)
    with profile(experimental_config=config) as prof:
        torch.add(torch.ones(2), 5)
    add = next(a for a in prof.trace.activities if a.name.startswith("aten::add"))
    assert add.name == "aten::add.Tensor" and add.args["Overload Name"] == "Tensor"
    event = next(e for e in prof.events() if e.name == "aten::add")
    assert event.overload_name == "Tensor"
    assert len(prof.key_averages(group_by_overload_name=True)) > len(prof.key_averages()) or "Overload Name" in (
        prof.key_averages(group_by_overload_name=True).table()
    )


@needs_observer
def test_with_modules_gives_torchscript_module_hierarchy():
    class Inner(torch.nn.Module):
        def forward(self, x):
            return x * 3

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) + 1

    model = torch.jit.script(Outer())
    with profile(with_modules=True) as prof:
        model(torch.rand(4))
    mul = next(a for a in prof.trace.activities if a.name == "aten::mul")
    assert mul.args["Module Hierarchy"] == "TOP(Outer)::forward.inner(Inner)::forward."


@needs_observer
def test_experimental_config_event_metadata_gc_and_trace_only(tmp_path):
    import gc

    with profile(experimental_config=ExperimentalConfig(expose_kineto_event_metadata=True)) as prof:
        torch.add(torch.ones(1), 5)
    assert "Ev Idx" in events_named(trace_json(prof, tmp_path), "aten::add")[0]["args"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates metadata_json for event_metadata
        assert "Ev Idx" in next(e for e in prof.events() if e.name == "aten::add").metadata_json

    with profile(experimental_config=ExperimentalConfig(record_python_gc_info=True)) as prof:
        gc.collect()
    gc_spans = [a for a in prof.trace.activities if a.name == "Python GC"]
    assert gc_spans and gc_spans[0].cat == "python_function" and gc_spans[0].duration > 0

    with profile(experimental_config=ExperimentalConfig(trace_only=True)) as prof:
        torch.ones(1)
    with pytest.raises(RuntimeError, match="trace_only"):
        prof.events()
    trace_json(prof, tmp_path)  # the trace is still written
    with pytest.warns(UserWarning, match="trace_only"):
        with profile(with_stack=True, experimental_config=ExperimentalConfig(trace_only=True)) as prof:
            torch.ones(1)
    assert prof.events() is not None


@needs_observer
def test_post_processing_timeout():
    with pytest.raises(ValueError, match="post_processing_timeout_s must be non-negative"):
        profile(post_processing_timeout_s=-1.0)
    with profile(post_processing_timeout_s=60.0) as prof:
        torch.mm(torch.rand(8, 8), torch.rand(8, 8))
    assert any(e.name == "aten::mm" for e in prof.events())
    with profile(post_processing_timeout_s=0.0) as prof:
        for _ in range(10):
            torch.mm(torch.rand(8, 8), torch.rand(8, 8))
    logger = logging.getLogger("torch.autograd.profiler")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        prof.events()
    finally:
        logger.removeHandler(handler)
    assert any("timed out" in r.getMessage() and "partial results" in r.getMessage() for r in records)


def _adds_counted(acc_events: bool, warmup: int, active: int, repeat: int) -> int:
    with profile(schedule=schedule(wait=0, warmup=warmup, active=active, repeat=repeat), acc_events=acc_events) as prof:
        for _ in range(100):
            torch.add(1, 2)
            prof.step()
    return next((e.count for e in prof.key_averages() if e.key == "aten::add"), 0)


@needs_observer
def test_acc_events_keeps_events_across_cycles():
    assert _adds_counted(True, warmup=10, active=10, repeat=4) == 40
    assert _adds_counted(False, warmup=10, active=10, repeat=4) == 10
    assert _adds_counted(True, warmup=1, active=5, repeat=0) == 83


@needs_observer
def test_activity_filters_keep_only_the_listed_types():
    with profile(activities=[{ProfilerActivity.CPU: ["USER_ANNOTATION"]}]) as prof:
        with record_function("kept"):
            torch.ones(1)
    assert {a.cat for a in prof.trace.activities} == {"user_annotation"}
    assert prof.trace.backends["torch"].dropped["activity filter"] > 0
    with profile(activities=[{ProfilerActivity.CPU: []}]) as prof:
        with record_function("dropped"):
            torch.ones(1)
    assert len(prof.trace.activities) == 0
    with pytest.raises(ValueError, match="more than once"):
        profile(activities=[ProfilerActivity.CPU, {ProfilerActivity.CPU: ["CPU_OP"]}])
    with pytest.raises(RuntimeError, match="Unknown or non-member activity type name: 'KERNEL'"):
        profile(activities=[{ProfilerActivity.CPU: ["KERNEL"]}])


@needs_observer
def test_toggle_collection_dynamic_leaves_out_what_ran_while_off():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mul(torch.ones(1), 2)
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CPU])
        torch.div(torch.ones(1), 2)
        prof.toggle_collection_dynamic(True, [ProfilerActivity.CPU])
        torch.sub(torch.ones(1), 2)
    names = {a.name for a in prof.trace.activities}
    assert {"aten::mul", "aten::sub"} <= names and "aten::div" not in names
    assert prof.trace.backends["torch"].dropped["collection toggled off"] > 0


@needs_observer
def test_step_tracker_advances_with_the_daemon_variable(monkeypatch):
    from torch.autograd.profiler import KinetoStepTracker

    monkeypatch.setenv("KINETO_USE_DAEMON", "1")
    before = KinetoStepTracker.current_step()
    with profile(schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(8):
            torch.ones(1)
            prof.step()
    assert KinetoStepTracker.current_step() == before + 8


@needs_observer
def test_profiler_object_events_stats_and_tree():
    with profile() as prof:
        with record_function("region"):
            torch.mm(torch.rand(8, 8), torch.rand(8, 8))
    stats = prof._stats()
    assert stats.number_of_events == 0 and stats.function_events_build_tree_call_duration_us == 0
    events = prof.events()
    assert stats.number_of_events == len(events) > 0
    region = next(e for e in events if e.name == "region")
    assert region.is_user_annotation and any(c.name == "aten::mm" for c in region.cpu_children)
    ops = [e for e in prof.profiler.kineto_results.events() if e.activity_type() == "cpu_op"]
    assert ops and all(e.device_type() == torch.autograd.DeviceType.CPU for e in ops)
    assert len({e.correlation_id() for e in ops}) == len(ops)
    roots = prof.profiler.kineto_results.experimental_event_tree()
    assert "region" in [n.name for n in roots]
    assert any(n.name == "aten::mm" for n in torch.profiler._utils.traverse_dfs(roots))


@needs_observer
def test_events_fields_as_torch_gives_them():
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale, y):
            return x + y * scale

        @staticmethod
        def backward(ctx, grad):
            return grad, None, grad

    x, y = torch.ones(2, 3, requires_grad=True), torch.ones(4, requires_grad=True)
    with profile(record_shapes=True) as prof:
        Scaled.apply(x, 2.0, y[:3])
        torch.rand(2, 6).as_strided([4, 3], [1, 4])
    (custom,) = [e for e in prof.events() if e.name == "Scaled"]
    assert custom.input_shapes == [[2, 3], [], [3]]
    strided = next(e for e in prof.events() if e.name == "aten::as_strided" and e.input_shapes[0] == [2, 6])
    assert strided.concrete_inputs[1:3] == [[4, 3], [1, 4]]


@needs_observer
def test_envelope_events_bound_every_event(tmp_path):
    with profile(with_stack=True) as prof:
        torch.add(torch.rand(4, 4), torch.rand(4, 4))
    doc = trace_json(prof, tmp_path)
    (span,) = events_named(doc, "PyTorch Profiler (0)")
    (start,) = events_named(doc, "Iteration Start: PyTorch Profiler")
    (end,) = events_named(doc, "Record Window End")
    assert span["cat"] == "Trace" and span["ts"] >= start["ts"]
    for e in doc["traceEvents"]:
        if "ts" in e and e is not start and e is not end:
            assert e["ts"] >= span["ts"], e
        if "dur" in e:
            assert e["ts"] + e["dur"] <= end["ts"], e
    from polyprof.formats import load_trace

    loaded = load_trace(str(tmp_path / "t.json"))
    assert "PyTorch Profiler (0)" not in {a.name for a in loaded.activities}


def test_distributed_info_written_as_torch_writes_it(tmp_path):
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.ones(1)
        path = tmp_path / "rank.json"
        prof.export_chrome_trace(str(path))
    finally:
        dist.destroy_process_group()
    text = path.read_text()
    assert '"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1' in text  # HTA's pattern
    info = json.loads(text)["distributedInfo"]
    assert info["pg_count"] == 1 and info["pg_config"]


# -- torch-side consumers see polyprof's annotations -------------------------------------------------


def test_torch_autograd_profiler_sees_polyprof_annotations():
    from torch.autograd.profiler import profile as autograd_profile

    with autograd_profile(record_shapes=True, use_kineto=True) as torch_prof:
        with polyprof.record_function("## polyprof ##", "1, 2"):
            torch.ones(1)
        with polyprof.record_function("## plain ##"):
            pass
    by_name = {e.name: e for e in torch_prof.function_events}
    assert by_name["## polyprof ##"].input_shapes == [[]] and by_name["## plain ##"].input_shapes == []
    assert by_name["## polyprof ##"].is_user_annotation
    assert any(c.name == "aten::ones" for c in by_name["## polyprof ##"].cpu_children)


def _et_nodes(path):
    return json.loads(open(path).read())["nodes"]


def _et_rf_ids(nodes):
    ids = []
    for n in nodes:
        if n["name"] in ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]"):
            continue
        ids += [a["value"] for a in n["attrs"] if a["name"] == "rf_id"]
    return sorted(ids)


@needs_observer
def test_execution_trace_observer_runs_in_the_windows_and_ids_match(tmp_path):
    from polyprof.profiler import ExecutionTraceObserver

    et_path = str(tmp_path / "et.json")
    with profile(
        schedule=schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=1),
        execution_trace_observer=ExecutionTraceObserver().register_callback(et_path),
    ) as prof:
        for i in range(7):
            with record_function(f"## LOOP {i} ##"):
                torch.mm(torch.rand(4, 4), torch.rand(4, 4)).sum()
            prof.step()
    nodes = _et_nodes(et_path)
    assert sum(n["name"].startswith("## LOOP") for n in nodes) == 2
    doc = trace_json(prof, tmp_path)
    kineto_ids = sorted(
        e["args"]["Record function id"] for e in doc["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")
    )
    assert kineto_ids == _et_rf_ids(nodes) and len(set(kineto_ids)) == len(kineto_ids)


@needs_observer
def test_execution_trace_alone_sees_polyprof_annotations(tmp_path):
    from polyprof.profiler import ExecutionTraceObserver

    et_path = str(tmp_path / "et.json")
    et = ExecutionTraceObserver().register_callback(et_path)
    et.start()
    with polyprof.record_function("## outside any profile ##"):
        torch.ones(1)
    et.stop()
    et.unregister_callback()
    assert any(n["name"] == "## outside any profile ##" for n in _et_nodes(et_path))


@needs_observer
def test_execution_trace_from_the_environment(monkeypatch):
    monkeypatch.setenv("ENABLE_PYTORCH_EXECUTION_TRACE", "1")
    with profile() as prof:
        torch.ones(1)
    assert prof.execution_trace_observer is not None
    written = prof.execution_trace_observer.get_output_file_path()  # a temporary file torch chose and keeps
    assert os.path.getsize(written) > 0
    os.unlink(written)


@needs_observer
def test_export_stacks_and_memory_timeline(tmp_path):
    # verbose: torch writes call stacks (and so export_stacks has lines) only then
    config = ExperimentalConfig(verbose=True)
    with profile(with_stack=True, record_shapes=True, profile_memory=True, experimental_config=config) as prof:
        x = torch.rand(64, 64)
        torch.mm(x, x)
    stacks = tmp_path / "stacks.txt"
    prof.export_stacks(str(stacks))
    lines = stacks.read_text().splitlines()
    assert lines and all(int(line.rsplit(" ", 1)[1]) > 0 for line in lines)
    timeline = tmp_path / "memory.json.gz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the timeline itself
        prof.export_memory_timeline(str(timeline))
    times, sizes = json.loads(gzip.decompress(timeline.read_bytes()))
    assert len(times) == len(sizes) > 0
    with profile(record_shapes=True) as prof:
        torch.ones(1)
    with pytest.raises(ValueError, match="profile_memory=True, with_stack=True required"):
        prof.export_memory_timeline(str(timeline))
