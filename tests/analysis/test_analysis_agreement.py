"""polyprof's analyses against the tools people trust, on the same real traces:

* Holistic Trace Analysis 0.5 (in its own environment, .venv-consumers) on a polyprof trace of CPU,
  torch ops and OpenCL work on PoCL: temporal breakdown, idle time by cause and kernel type breakdown.
  HTA leaves the last step out when it reads a trace: it keeps what was launched before the last
  ``ProfilerStep`` span starts, host or device side (``_as_hta_reads`` cuts polyprof's trace the same
  way), and by default rounds every event inward to whole microseconds (``ts`` up, end
  down, pytorch#122425), which shortens each by up to 2 us: compared with that rounding off
  (HTA_DISABLE_NS_ROUNDING=1), the numbers agree within 1%; its kernel type times also truncate each
  segment to whole microseconds, so that comparison uses millisecond-long device work.
* torch.profiler's own ``key_averages()`` on a torch.profiler trace of a CPU model: every op's calls,
  total and self CPU time.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polyprof.analysis import device
from polyprof.analysis.operators import operator_table
from polyprof.formats import load_trace
from polyprof.model.work import DEVICE_ROW_KINDS, DeviceWork

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = Path(os.environ.get("POLYPROF_CONSUMERS_PYTHON", ROOT / ".venv-consumers" / "bin" / "python"))

WORKLOAD = r"""
import sys
import numpy as np, pyopencl as cl, torch
from polyprof.profiler import ProfilerActivity, profile, record_function, schedule

ctx = cl.create_some_context(interactive=False)
program = cl.Program(ctx, "__kernel void spin(__global float *x) { float v = x[get_global_id(0)]; "
    "for (int k = 0; k < 2048; k++) v = v * 1.0001f + 0.5f; x[get_global_id(0)] = v; }").build()
model = torch.nn.Linear(64, 64)
a = np.arange(1 << 22, dtype=np.float32)  # 16 MB: copies and fills of a millisecond or more
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, a.nbytes)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.OPENCL], schedule=schedule(wait=0, warmup=1, active=4, repeat=1)) as prof:
    queue = None
    for step in range(6):
        if queue is None:  # made while the profile runs, so that the OpenCL backend sees it
            queue = cl.CommandQueue(ctx)
        with record_function("forward"):
            model(torch.randn(32, 64)).sum().backward()
        cl.enqueue_copy(queue, buf, a)
        cl.enqueue_fill_buffer(queue, buf, np.float32(1), 0, a.nbytes // 2)
        program.spin(queue, (1 << 16,), None, buf)
        cl.enqueue_copy(queue, a, buf)
        queue.finish()
        prof.step()
prof.export_chrome_trace(sys.argv[1])
"""

HTA = r"""
import json, sys, warnings, logging
warnings.simplefilter("ignore"); logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
k = a.get_gpu_kernel_breakdown(visualize=False)[0]
t = a.get_temporal_breakdown(visualize=False)
idle = a.get_idle_time_breakdown(ranks=[0], visualize=False)[0]
print(json.dumps({
    "kernel_types": dict(zip(k["kernel_type"], map(float, k["sum"]))),
    "temporal": {c: float(t[c].iloc[0]) for c in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)")},
    "idle": {r["idle_category"]: float(r["idle_time"]) for _, r in idle.iterrows()},
    "gpu_rows": int((a.t.get_trace(0)["stream"] != -1).sum()),
}))
"""


@pytest.fixture(scope="module")
def opencl_trace(tmp_path_factory):
    pytest.importorskip("pyopencl", reason="needs pyopencl and PoCL for device rows (polyprof-opencl[test])")
    pytest.importorskip("torch", reason="needs torch for aten ops")
    folder = tmp_path_factory.mktemp("hta")
    script = folder / "workload.py"
    script.write_text(WORKLOAD)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(script), str(folder / "rank0.json")], check=True, env=env, timeout=300)
    return folder


def _hta(folder, rounding):
    env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "0" if rounding else "1"}
    r = subprocess.run([str(CONSUMERS), "-c", HTA, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _as_hta_reads(trace):
    """The rows HTA 0.5 keeps (Trace._filter_irrelevant_gpu_kernels): host rows that start before the
    last ProfilerStep span (host or device side) does, and device rows launched by one of them."""
    acts = trace.activities
    names = acts.names()
    cutoff = acts["start"][np.array([str(n).startswith("ProfilerStep#") for n in names])].max()
    at = acts["start"].copy()
    rows = np.flatnonzero(np.isin(acts["kind"], DEVICE_ROW_KINDS))
    at[rows] = device.launch_starts(trace, rows, acts["correlation"][rows])
    keep = np.flatnonzero(at < cutoff)
    keep = keep[~np.isin(keep, rows) | (at[keep] >= 0)]
    return dataclasses.replace(trace, activities=acts.take(keep))


def _close(ours_ns, theirs_us, rel=0.01):
    assert ours_ns / 1000 == pytest.approx(theirs_us, rel=rel, abs=0.5), (ours_ns / 1000, theirs_us)


@pytest.mark.skipif(not CONSUMERS.exists(), reason=f"needs HTA in {CONSUMERS} (scripts/setup.sh --test)")
def test_device_numbers_agree_with_holistic_trace_analysis(opencl_trace):
    trace = load_trace(opencl_trace / "rank0.json")
    same = _as_hta_reads(trace)
    hta = _hta(opencl_trace, rounding=False)
    assert hta["gpu_rows"] == len(DeviceWork(same).rows) > 0, "the same device rows"
    (temporal,) = device.temporal_breakdown(same).dicts()
    _close(temporal["span_ns"], hta["temporal"]["kernel_time(us)"])
    _close(temporal["idle_ns"], hta["temporal"]["idle_time(us)"])
    _close(temporal["compute_ns"], hta["temporal"]["compute_time(us)"])
    _close(temporal["non_compute_ns"], hta["temporal"]["non_compute_time(us)"])
    idle: dict[str, int] = {}
    for r in device.idle_breakdown(same).dicts():
        idle[r["cause"]] = idle.get(r["cause"], 0) + r["idle_ns"]
    for ours, theirs in (("host wait", "host_wait"), ("kernel wait", "kernel_wait"), ("other", "other")):
        _close(idle[ours], hta["idle"].get(theirs, 0.0))
    types = {r["kind"]: r["total_ns"] for r in device.kernel_types(same).dicts()}
    assert set(types) == set(hta["kernel_types"])
    for kind, us in hta["kernel_types"].items():
        _close(types[kind], us)
    rounded = _hta(opencl_trace, rounding=True)  # HTA's default: each row rounded inward to whole us
    assert rounded["temporal"]["compute_time(us)"] <= hta["temporal"]["compute_time(us)"]


def test_operator_times_agree_with_torch_profilers_own_tables(tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            model(torch.randn(16, 64)).sum().backward()
    path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(path))
    theirs = {e.key: e for e in prof.key_averages()}
    ours = {r["op"]: r for r in operator_table(load_trace(str(path))).dicts()}
    checked = 0
    for name, avg in theirs.items():
        if name not in ours or avg.cpu_time_total < 50:  # µs; the shortest ops are below the trace's resolution
            continue
        mine = ours[name]
        assert mine["calls"] == avg.count, name
        assert mine["total_ns"] / 1000 == pytest.approx(avg.cpu_time_total, rel=0.01, abs=1), name
        assert mine["self_ns"] / 1000 == pytest.approx(avg.self_cpu_time_total, rel=0.01, abs=1), name
        checked += 1
    assert checked >= 5 and {"aten::linear", "aten::addmm"} <= set(ours)
