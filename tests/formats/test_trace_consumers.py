"""polyprof traces read right by the tools torch.profiler users open them with: Holistic Trace Analysis
0.5 and torch-tb-profiler's loader, real installs in their own environment (``.venv-consumers``, made by
``scripts/setup.sh --test``: HTA needs pandas < 3)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = Path(os.environ.get("POLYPROF_CONSUMERS_PYTHON", ROOT / ".venv-consumers" / "bin" / "python"))
pytestmark = pytest.mark.skipif(
    not CONSUMERS.exists(), reason=f"needs HTA and torch-tb-profiler in {CONSUMERS} (scripts/setup.sh --test)"
)
pytest.importorskip("pyopencl", reason="needs pyopencl and PoCL for device rows (polyprof-opencl[test])")
torch = pytest.importorskip("torch", reason="needs torch for aten ops and torch.distributed")

WORKLOAD = r"""
import sys
import numpy as np, pyopencl as cl, torch
from polyprof.profiler import ProfilerActivity, profile, record_function, schedule

rank = int(sys.argv[2])
ctx = cl.create_some_context(interactive=False)
program = cl.Program(ctx, "__kernel void twice(__global float *x) { float v = x[get_global_id(0)]; "
    "for (int k = 0; k < 256; k++) v = v * 1.0001f + 0.5f; x[get_global_id(0)] = v; }").build()
model = torch.nn.Linear(16, 16)
with profile(
    activities=[ProfilerActivity.CPU, ProfilerActivity.OPENCL],
    schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
    record_shapes=True,
) as prof:
    queue = None
    for step in range(5):
        if queue is None:  # created during warm-up, the usual way to write it
            queue = cl.CommandQueue(ctx)
        with record_function("forward"):
            model(torch.randn(4, 16)).sum().backward()
        a = np.arange(1 << 16, dtype=np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, a.nbytes)
        cl.enqueue_copy(queue, buf, a)
        cl.enqueue_fill_buffer(queue, buf, np.float32(1), 0, 1024)
        program.twice(queue, a.shape, None, buf)
        mapped, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ, 0, a.shape, a.dtype)
        mapped.base.release(queue)
        cl.enqueue_copy(queue, a, buf)
        queue.finish()
        prof.step()
    if rank == 1:  # a user's own distributedInfo: written with torch's spacing, so HTA finds the rank
        prof.add_metadata("distributedInfo", {"backend": "gloo", "rank": 1, "world_size": 2})
prof.export_chrome_trace(sys.argv[1])
"""

CHECK = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
out = {"ranks": sorted(analysis.t.traces)}
kernels = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
out["kernel_types"] = dict(zip(kernels["kernel_type"], kernels["sum"]))
temporal = analysis.get_temporal_breakdown(visualize=False)
out["temporal_columns"] = list(temporal.columns)
out["iterations"] = sorted(int(i) for i in analysis.t.get_trace(0)["iteration"].unique() if i >= 0)
from torch_tb_profiler.profiler.data import RunProfileData
tb = RunProfileData.parse("rank0", "span", sys.argv[2], sys.argv[3])  # its cache folder
out["tb"] = {"has_kernel": tb.has_kernel, "has_memcpy_or_memset": tb.has_memcpy_or_memset,
             "steps": list(tb.steps_names), "distributed": tb.distributed_info}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    for rank in (0, 1):
        path = folder / f"rank{rank}.json.gz"
        script = WORKLOAD
        if rank == 0:  # rank 0 from a real (one-process) torch.distributed job
            script = script.replace(
                "rank = int(sys.argv[2])",
                "rank = int(sys.argv[2])\nimport torch.distributed as dist\n"
                "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)",
            )
        done = subprocess.run(
            [sys.executable, "-c", script, str(path), str(rank)], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return folder


def test_hta_and_tensorboard_read_polyprof_traces(two_ranks, tmp_path):
    # HTA rounds start times up and ends down to whole microseconds, which gives device rows shorter
    # than 1 us (PoCL's fills and maps) a negative duration and trips its temporal breakdown; its own
    # switch keeps nanoseconds (README, "Trace consumers")
    env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}
    done = subprocess.run(
        [str(CONSUMERS), "-c", CHECK, str(two_ranks), str(two_ranks / "rank0.json.gz"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ranks"] == [0, 1]  # each file's rank found: not all analysed as rank 0
    # copies, fills and map/unmap are memory to HTA, kernels computation
    assert out["kernel_types"]["MEMORY"] > 0 and out["kernel_types"]["COMPUTATION"] > 0
    assert {"idle_time(us)", "compute_time(us)", "non_compute_time(us)"} <= set(out["temporal_columns"])
    assert out["iterations"] == [1, 2, 3]  # the device rows belong to the ProfilerSteps
    assert out["tb"]["has_kernel"] and out["tb"]["has_memcpy_or_memset"]
    assert out["tb"]["steps"] and out["tb"]["distributed"]["rank"] == 0


def test_opencl_queue_made_during_warm_up_is_timed(two_ranks):
    from polyprof.formats import load_trace

    trace = load_trace(str(two_ranks / "rank0.json.gz"))
    kernels = [a for a in trace.activities if a.cat == "kernel"]
    assert len(kernels) == 3  # the three active steps; none left as an untimed enqueue
    assert {trace.resources[k.resource].id for k in kernels} == {1}  # queue 1: never tid 0
    names = {a.name for a in trace.activities if a.cat in ("gpu_memcpy", "gpu_memset")}
    assert all(n.startswith(("Memcpy", "Memset")) for n in names) and "Memcpy Map" in names
    doc = json.loads(__import__("gzip").decompress((two_ranks / "rank0.json.gz").read_bytes()))
    assert '"rank": 0' in json.dumps(doc["distributedInfo"])
