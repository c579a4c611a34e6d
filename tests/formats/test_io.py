import gzip
import json
import os
import subprocess
import sys

import pytest

from polyprof.errors import TraceFormatError
from polyprof.formats import load_trace
from polyprof.model import ActivityKind

POLYPROF = [sys.executable, "-m", "polyprof"]


@pytest.mark.parametrize(
    "content,match",
    [
        (b'{"traceEvents": [{"ph": "X", "name": "a"', "is truncated"),
        (b"this is not json", "is not valid JSON"),
        (b'{"hello": "world"}', "not a Chrome trace"),
        (b"", "the file is empty"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon"}]}', "non-numeric timestamp"),
        (gzip.compress(b'{"traceEvents": [')[:-6], "gzip data is truncated"),
    ],
)
def test_bad_trace_files_give_one_line_errors(tmp_path, content, match):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=match) as err:
        load_trace(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "nope.json")


@pytest.mark.parametrize("content", [b'{"traceEvents": [', b"[1, 2", b'{"x": 1}'])
def test_cli_summary_of_bad_file_exits_2_without_traceback(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    r = subprocess.run([*POLYPROF, "summary", str(path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert str(path) in r.stderr


def test_bare_event_array_is_accepted(tmp_path):
    path = tmp_path / "arr.json"
    path.write_text(
        json.dumps([{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 1, "ts": 1.5, "dur": 2.25}])
    )
    (k,) = load_trace(path).activities
    assert k.kind == ActivityKind.KERNEL and k.start == 1500 and k.duration == 2250


def test_reads_a_trace_written_by_torch_profiler(tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch to produce a real torch.profiler trace")
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("my_block"):
            x = torch.ones(8, 8)
            (x @ x).sum()
    path = str(tmp_path / "torch.json")
    prof.export_chrome_trace(path)
    trace = load_trace(path)
    names = {a.name for a in trace.activities}
    assert "my_block" in names and "aten::matmul" in names
    ops = trace.activities_of(ActivityKind.CPU_OP)
    assert ops and all(o.external_id > 0 for o in ops)
    ann = [a for a in trace.activities if a.name == "my_block"][0]
    assert ann.kind == ActivityKind.USER_ANNOTATION
    assert trace.devices[ops[0].device].pid == os.getpid()
    r = subprocess.run([*POLYPROF, "summary", path], capture_output=True, text=True)
    assert r.returncode == 0 and "aten::matmul" in r.stdout


def test_kineto_traces_older_categories_labels_and_envelope(tmp_path):
    """A torch.profiler GPU trace as older Kineto and MTIA write it: categories Memcpy/Memset/Runtime and
    mtia_ccp_events, every GPU process named after the host, its label "GPU n"; the envelope span."""
    from polyprof.analysis import summarize

    doc = {
        "schemaVersion": 1,
        "host_name": "node7",
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 11, "tid": 0, "args": {"name": "node7"}},
            {"ph": "M", "name": "process_labels", "pid": 11, "tid": 0, "args": {"labels": "CPU"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "node7"}},
            {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
            {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 11, "tid": 11, "ts": 1, "dur": 9},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 11, "ts": 2, "dur": 1},
            {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 3, "dur": 2},
            {"ph": "X", "cat": "Memset", "name": "Memset", "pid": 0, "tid": 7, "ts": 5, "dur": 1},
            {"ph": "X", "cat": "mtia_ccp_events", "name": "mtia_kernel", "pid": 0, "tid": 7, "ts": 6, "dur": 1},
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
             "ts": 0, "dur": 20},
            {"ph": "M", "name": "process_sort_index", "pid": "Spans", "tid": 0, "args": {"sort_index": 536870912}},
        ],
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    trace = load_trace(path)
    kinds = {a.name: a.kind for a in trace.activities}
    assert kinds["cudaLaunchKernel"] == ActivityKind.RUNTIME
    assert kinds["Memcpy HtoD"] == ActivityKind.GPU_MEMCPY and kinds["Memset"] == ActivityKind.GPU_MEMSET
    assert kinds["mtia_kernel"] == ActivityKind.KERNEL
    assert "PyTorch Profiler (0)" not in kinds and len(trace.devices) == 2  # the envelope is no activity
    headings = {r.device for r in summarize(trace)}
    assert headings == {"node7", "GPU 0"}  # the GPU by its label, not the host name it shares


def test_a_range_profiler_row_is_read_as_a_range_not_a_kernel(tmp_path):
    """Kineto's cuda_profiler_range rows split the profiling window evenly among the ranges and carry no
    device time: a range on the device's timeline, never a kernel in the kernel analyses."""
    from polyprof.model.work import DeviceWork

    events = [{"ph": "X", "cat": "cuda_profiler_range", "name": f"range {i}", "pid": 0, "tid": 7,
               "ts": 1000 + i * 121431, "dur": 121431, "args": {"device": 0}} for i in range(3)]
    events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1500, "dur": 20,
                   "args": {"device": 0}})
    path = tmp_path / "ranges.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    kinds = {a.name: a.kind for a in trace.activities}
    assert kinds["range 0"] == ActivityKind.GPU_USER_ANNOTATION and kinds["gemm"] == ActivityKind.KERNEL
    names = trace.activities.names()
    assert {names[r] for r in DeviceWork(trace).rows.tolist()} == {"gemm"}, "the kernel analyses see one kernel"
