#!/usr/bin/env python3
"""GPU check for polyprof-cuda: run on a machine with one NVIDIA GPU, torch (CUDA build) and cupti-python.

    python plugins/polyprof-cuda/scripts/device-check.py [--out report.md] [--parts a_polyprof,a_torch]

On the lent GPU machine, scripts/device-run.sh installs the carried wheels and runs this (see the
plugin README, "Checking on a GPU"). Each part runs in its own process (so that torch.profiler's CUPTI
use cannot disturb polyprof's) with a time limit, and a failing part is reported, not fatal:

  env           versions (driver, CUDA, torch, cupti-python, libcupti), polyprof's backends and why any
                is unavailable, which torch recorder can run (the observer build);
  (a) a torch workload (matmuls, elementwise ops, H2D/D2H copies, a memset, a CUDA graph replay) traced
      by polyprof [CPU, CUDA] and by torch.profiler [CPU, CUDA]: same multiset of kernel names, same
      memcpy/memset counts, every kernel with a flow from its launch and an External id naming an aten
      op, and the same (op, kernel) attribution as torch.profiler; then again with with_stack=True
      (polyprof falls back to torch's collector in CPU-only mode): kernels must still reach polyprof;
  (b) CuPy, Numba, cuda-python (cuda.bindings + NVRTC) and JAX without torch, and a Triton kernel:
      their kernels and copies appear, linked to their launches;
  (c) a launch-bound loop of 10,000 tiny kernels: wall time unprofiled, under torch.profiler, under
      polyprof, and the overhead ratio;
  (d) stop-to-trace-written time for both, and polyprof's CUDA records processed per second at stop;
  (e) GPU counters through NVML (polyprof-cuda[nvml]) under load, on the GPU's process;
  (f) kernels launched under record_function opened every way (with block, decorator, asyncio tasks)
      land under their span;
  (g) PyTorch Lightning, unchanged, on the GPU with polyprof behind torch.profiler
      (polyprof.install_torch_profiler(), as POLYPROF_TORCH_PROFILER=1 does): Lightning's PyTorchProfiler
      asks for [CPU, CUDA], which polyprof maps to polyprof-cuda; its traces must be polyprof's and hold
      the aten ops and kernel names of torch.profiler's traces of the same fit;
  (h) the flight recorder with [cpu, cuda]: a slow step and an out-of-memory attempt captured, with kernels.
Writes a markdown report (stdout, and --out or $OUT/device-check-report.md when given).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter

from polyprof.testing.device_check import PART_TIMEOUT_S, DeviceCheck, json_default

TINY_KERNELS = 10_000
KEPT_TRACES = ("a_polyprof", "a_torch", "b_cupy", "b_triton")
#: the parts below (each in a process of its own, with a time limit) and the report (report_lines)
CHECK = DeviceCheck("polyprof-cuda device check", report=lambda res: report_lines(res),
                    report_name="device-check-report.md")



def _postprocess_ms(trace) -> dict:
    """Where stop-to-trace went, as the trace file writes it (each backend's phases, the merge by pass)."""
    from polyprof.formats.chrome.write import trace_metadata

    return trace_metadata(trace).get("polyprof", {}).get("postprocess_ms", {})

# -- reading a Kineto-dialect trace (torch.profiler's or polyprof's) ------------------------------
def trace_summary(doc: dict) -> dict:
    """What the report compares: kernels, copies, fills, flows and which op each kernel is charged to."""
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    # a flow's end binds to the slice it lands on (same pid, tid and ts), whatever its id
    flow_starts = {e["id"] for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    linked_slices = {
        (e["pid"], e["tid"], e["ts"])
        for e in events
        if e.get("ph") == "f" and e.get("cat") == "ac2g" and e["id"] in flow_starts
    }
    host_by_id = {}
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {}):
            host_by_id[e["args"]["External id"]] = (e["cat"], e["name"])

    def charged_to(kernel: dict) -> str:
        cat_name = host_by_id.get(kernel.get("args", {}).get("External id"))
        return cat_name[1] if cat_name else "-"

    return {
        "n_kernels": len(kernels),
        "kernels": Counter(e["name"] for e in kernels),
        "memcpy": sum(1 for e in events if e.get("cat") == "gpu_memcpy"),
        "memset": sum(1 for e in events if e.get("cat") == "gpu_memset"),
        "kernels_with_flow": sum(1 for e in kernels if (e["pid"], e["tid"], e["ts"]) in linked_slices),
        "kernels_charged_to_op": sum(
            1 for e in kernels if host_by_id.get(e.get("args", {}).get("External id"), ("",))[0] == "cpu_op"
        ),
        "attribution": Counter(f"{charged_to(e)} -> {e['name']}" for e in kernels),
    }


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def polyprof_status(doc: dict) -> dict:
    return doc.get("polyprof", {}).get("backends", {})


# -- workloads ------------------------------------------------------------------------------------
def torch_workload(torch, graph=True):
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    host = torch.randn(1 << 20).pin_memory()
    for _ in range(3):
        c = (a @ b).relu() + 1.0
        d = host.to("cuda", non_blocking=True)
        c.zero_()
        _memset(torch, d)
        _ = d.cpu()
    if graph:
        static = torch.randn(256, 256, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                static.mul_(2)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static.mul_(2)
            static.add_(1)
        for _ in range(2):
            g.replay()
    torch.cuda.synchronize()


def _memset(torch, tensor) -> None:
    """A real cudaMemsetAsync (torch's zero_() is a fill kernel), through cuda.bindings when present."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return
    stream = torch.cuda.current_stream().cuda_stream
    (err,) = cudart.cudaMemsetAsync(tensor.data_ptr(), 0, tensor.numel() * tensor.element_size(), stream)
    if int(err) != 0:
        raise RuntimeError(f"cudaMemsetAsync failed: {err}")


def tiny_loop(torch, n=TINY_KERNELS):
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


# -- parts ----------------------------------------------------------------------------------------
@CHECK.part
def env(out):
    import platform
    from importlib.metadata import PackageNotFoundError, version

    info = {"python": platform.python_version()}
    for dist in ("polyprof", "polyprof-cuda", "cupti-python", "nvidia-cuda-cupti", "cuda-bindings", "torch"):
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    try:
        from polyprof_cuda.cupti_layer import CuptiLayer, cuda_version_text

        driver = CuptiLayer.driver_version()
        info["driver_cuda"] = cuda_version_text(driver) if driver else None
    except Exception as exc:
        info["driver_cuda"] = f"unknown ({exc})"
    from polyprof.engine.registry import default

    backends = {}
    for entry in sorted(default.entries(), key=lambda e: e.name):
        if entry.error or entry.conflict:
            backends[entry.name] = f"broken: {entry.error or entry.conflict}"
            continue
        avail = default.probe(entry)
        backends[entry.name] = (
            f"available: {', '.join(avail.devices)}" if avail.available else f"unavailable: {avail.reason}"
        )
    info["backends"] = backends
    from polyprof._native import extension as speedups

    # how the recorder reads its clock (part f: its spans against CUPTI's kernel times)
    info["recorder_clock"] = speedups.clock_source() if speedups is not None else "clock_gettime (pure Python)"
    try:
        import torch

        from polyprof.torch import observer as torch_observer

        info["torch_cuda"] = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)"
        if torch.cuda.is_available():
            info["torch_cuda"] += f": {torch.cuda.get_device_name(0)}"
        t0 = time.perf_counter()
        torch_observer.get(torch)  # built once here for every later part (cached on disk)
        info["torch_observer"] = f"built or loaded in {time.perf_counter() - t0:.1f} s"
    except Exception as exc:  # BuildError: torch's collector will record the ops, with a warning
        info["torch_observer"] = f"error: {type(exc).__name__}: {exc}"
    return info


def _profiler(which: str):
    """torch.profiler or polyprof.profiler: the same names, so each part runs the same code under both."""
    import importlib

    return importlib.import_module("torch.profiler" if which == "torch" else "polyprof.profiler")


def _traced_torch_workload(which: str, out: str, graph: bool = True, **options) -> dict:
    """The torch workload, warmed up (cuBLAS handles, graph pools), then traced [CPU, CUDA] into `out`."""
    import torch

    profiler = _profiler(which)
    torch_workload(torch, graph=graph)
    activities = [profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.CUDA]
    with profiler.profile(activities=activities, **options) as prof:
        torch_workload(torch, graph=graph)
    prof.export_chrome_trace(out)
    return load(out)


@CHECK.part
def a_polyprof(out):
    doc = _traced_torch_workload("polyprof", out)
    return {**trace_summary(doc), "backends": polyprof_status(doc)}


@CHECK.part
def a_torch(out):
    return trace_summary(_traced_torch_workload("torch", out))


@CHECK.part
def a_polyprof_collector(out):
    """with_stack=True: polyprof's observer takes each op's Python stack, the python backend the frames;
    kernels must still reach polyprof with their flows."""
    doc = _traced_torch_workload("polyprof", out, graph=False, with_stack=True)
    return {**trace_summary(doc), "backends": polyprof_status(doc)}


@CHECK.part
def a_after_torch_profiler(out):
    """torch.profiler first, then polyprof, in one process: Kineto stays subscribed to CUPTI (idle)."""
    _traced_torch_workload("torch", out)
    doc = _traced_torch_workload("polyprof", out)
    return {**trace_summary(doc), "backends": polyprof_status(doc)}


@CHECK.part
def a_torch_after_polyprof(out):
    """polyprof first, then torch.profiler, in one process: torch's trace must be whole."""
    _traced_torch_workload("polyprof", out)
    return trace_summary(_traced_torch_workload("torch", out))


def _nccl_collectives(which: str, out: str) -> dict:
    """A one-rank NCCL process group (single GPU): all_reduce and broadcast under [CPU, CUDA]; Kineto
    writes record_param_comms ops with the collective's args (issue #16: polyprof's observer too)."""
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        profiler = _profiler(which)
        t = torch.ones(1 << 16, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                dist.all_reduce(t)
                dist.broadcast(t, 0)
            torch.cuda.synchronize()
        prof.export_chrome_trace(out)
    finally:
        dist.destroy_process_group()
    doc = load(out)
    keys = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name", "Rank")
    comms = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"]
    return {
        "distributedInfo": doc.get("distributedInfo"),
        "record_param_comms": len(comms),
        "with_collective_args": sum(all(k in e.get("args", {}) for k in keys) for e in comms),
        "collectives": sorted({e.get("args", {}).get("Collective name", "?") for e in comms}),
        "nccl_kernels": sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()),
    }


@CHECK.part
def d_nccl_polyprof(out):
    return _nccl_collectives("polyprof", out)


@CHECK.part
def d_nccl_torch(out):
    return _nccl_collectives("torch", out)


def _without_torch(result: dict) -> dict:
    result["torch_imported"] = "torch" in sys.modules
    return result


@CHECK.part
def b_cupy(out):
    import cupy as cp

    import polyprof

    x = cp.arange(1 << 20, dtype=cp.float32)
    (cp.sin(x) * 2).sum()  # compile outside the window
    cp.cuda.Device().synchronize()
    with polyprof.profile(["cpu", "cuda"]) as prof:
        with polyprof.record_function("cupy_step"):
            y = cp.sin(x) * 2
            z = cp.asnumpy(y)
        cp.cuda.Device().synchronize()
    prof.export_chrome_trace(out)
    s = trace_summary(load(out))
    s["result_ok"] = bool(abs(float(z[1]) - 2 * __import__("math").sin(1.0)) < 1e-4)
    return _without_torch(s)


@CHECK.part
def b_numba(out):
    import numpy as np

    # numba-cuda releases that still call np.row_stack (gone in numpy 2.4) fail to compile any kernel
    # beside a newer numpy; the alias lets the check reach polyprof, and the report says it was needed
    shimmed = not hasattr(np, "row_stack")
    if shimmed:
        np.row_stack = np.vstack
    from numba import cuda

    import polyprof

    @cuda.jit
    def polyprof_scale(x, a):
        i = cuda.grid(1)
        if i < x.size:
            x[i] *= a

    x = cuda.to_device(np.ones(1 << 20, dtype=np.float32))
    polyprof_scale[4096, 256](x, 2.0)  # compile outside the window
    cuda.synchronize()
    with polyprof.profile(["cpu", "cuda"]) as prof:
        with polyprof.record_function("numba_step"):
            polyprof_scale[4096, 256](x, 2.0)
            host = x.copy_to_host()
        cuda.synchronize()
    prof.export_chrome_trace(out)
    s = trace_summary(load(out))
    s["result_ok"] = bool(host[0] == 4.0)
    s["numpy_row_stack_alias_added"] = shimmed
    return _without_torch(s)


CUDA_C_SOURCE = b"""
extern "C" __global__ void polyprof_axpy(float a, float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + 1.0f;
}
"""


def _checked(result):
    """cuda.bindings calls return (error, values...): raise on error, return the values."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err}")
    return values[0] if len(values) == 1 else tuple(values)


@CHECK.part
def b_cuda_python(out):
    import numpy as np
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc

    import polyprof

    _checked(cu.cuInit(0))
    dev = _checked(cu.cuDeviceGet(0))
    major = _checked(
        cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    )
    minor = _checked(
        cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    )
    prog = _checked(nvrtc.nvrtcCreateProgram(CUDA_C_SOURCE, b"axpy.cu", 0, [], []))
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    _checked(nvrtc.nvrtcCompileProgram(prog, len(opts), opts))
    ptx = b" " * _checked(nvrtc.nvrtcGetPTXSize(prog))
    _checked(nvrtc.nvrtcGetPTX(prog, ptx))
    ctx = _checked(cu.cuDevicePrimaryCtxRetain(dev))
    _checked(cu.cuCtxSetCurrent(ctx))
    module = _checked(cu.cuModuleLoadData(ptx))
    kernel = _checked(cu.cuModuleGetFunction(module, b"polyprof_axpy"))
    n = 1 << 20
    host = np.ones(n, dtype=np.float32)
    dptr = _checked(cu.cuMemAlloc(host.nbytes))
    a, count, ptr = np.array([2.0], np.float32), np.array([n], np.int32), np.array([int(dptr)], np.uint64)
    params = np.array([a.ctypes.data, ptr.ctypes.data, count.ctypes.data], dtype=np.uint64)
    with polyprof.profile(["cpu", "cuda"]) as prof:
        with polyprof.record_function("cuda_python_step"):
            _checked(cu.cuMemcpyHtoD(dptr, host.ctypes.data, host.nbytes))
            _checked(cu.cuLaunchKernel(kernel, n // 256, 1, 1, 256, 1, 1, 0, 0, params.ctypes.data, 0))
            _checked(cu.cuMemcpyDtoH(host.ctypes.data, dptr, host.nbytes))
        _checked(cu.cuCtxSynchronize())
    prof.export_chrome_trace(out)
    s = trace_summary(load(out))
    s["result_ok"] = bool(host[0] == 3.0)
    return _without_torch(s)


@CHECK.part
def b_jax(out):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    import polyprof

    x = jnp.ones((1024, 1024))
    f = jax.jit(lambda m: (m @ m).sum())
    f(x).block_until_ready()
    with polyprof.profile(["cpu", "cuda"]) as prof:
        with polyprof.record_function("jax_step"):
            r = f(x).block_until_ready()
    prof.export_chrome_trace(out)
    s = trace_summary(load(out))
    s["result_ok"] = bool(float(r) == 1024.0 * 1024 * 1024)
    s["jax_devices"] = [str(d) for d in jax.devices()]
    return _without_torch(s)


@CHECK.part
def b_triton(out):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from triton_kernels import add

    import polyprof

    x, y = torch.rand(1 << 20, device="cuda"), torch.rand(1 << 20, device="cuda")
    add(x, y)  # compile outside the window
    torch.cuda.synchronize()
    with polyprof.profile(["cpu", "cuda"]) as prof:
        with polyprof.record_function("triton_step"):
            z = add(x, y)
        torch.cuda.synchronize()
    prof.export_chrome_trace(out)
    s = trace_summary(load(out))
    s["result_ok"] = bool(torch.allclose(z, x + y))
    return s


@CHECK.part
def h_flight(out):
    """(h) The flight recorder with [cpu, cuda] on a small CUDA training loop: a slow step (a sleep at
    step 30) and an out-of-memory attempt, each captured; the captures must hold kernels (the CUDA
    backend hands rows over while recording) and name their trigger."""
    import torch

    import polyprof

    folder = os.path.join(os.path.dirname(out), "flight")
    recorder = polyprof.flight_recorder(seconds=10, out_dir=folder, activities=["cpu", "cuda"], hang_s=None,
                                        signals=(), capturable=False)
    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        model(torch.randn(256, 1024, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        if step == 30:
            time.sleep(0.5)
    oom = False
    try:
        torch.empty(1 << 48, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        oom = True
    for _ in range(3):  # the oom capture is asked from inside the allocator; one more step lets it run
        opt.step()
    recorder.wait(120)
    recorder.stop()
    captures = {}
    for path in recorder.captures:
        trace = polyprof.load_trace(path)
        flight = trace.metadata["polyprof.flight"]
        kernels = [a for a in trace.activities if a.kind == polyprof.ActivityKind.KERNEL]
        captures[flight["trigger"]] = {"evidence": flight["evidence"], "kernels": len(kernels),
                                       "rows": len(trace.activities), "cuda": trace.backends.get("cuda").to_json()
                                       if "cuda" in trace.backends else None}
    return {"oom_raised": oom, "captures": captures, "failures": recorder.failures,
            "write_s": recorder.write_seconds}


FLIGHT_BY_VARIABLE = """
import time, torch
cuda_at_import = torch.cuda.is_initialized()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    model(torch.randn(256, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    if step == 30:
        time.sleep(0.5)
print("cuda initialised by import torch:", cuda_at_import, flush=True)
"""


@CHECK.part
def h_flight_variable(out):
    """(h2) The flight recorder as users switch it on: POLYPROF_FLIGHT_RECORDER on an unchanged CUDA script
    (armed at `import torch`): the script runs, CUDA is not initialised by the hook, the slow step at
    step 30 is captured."""
    folder = os.path.join(os.path.dirname(out), "flight-variable")
    env = {**os.environ, "POLYPROF_FLIGHT_RECORDER": "10,hang_s=off", "POLYPROF_FLIGHT_DIR": folder}
    run = subprocess.run([sys.executable, "-c", FLIGHT_BY_VARIABLE], env=env, capture_output=True, text=True,
                         timeout=PART_TIMEOUT_S)
    captures = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return {"returncode": run.returncode, "stdout": run.stdout[-500:], "stderr": run.stderr[-2000:],
            "captures": captures}


@CHECK.part
def c_unprofiled(out):
    import torch

    tiny_loop(torch, 1000)
    return {"seconds": min(tiny_loop(torch) for _ in range(3))}


PROFILED_RUNS = 3  # each profiled loop is timed this many times (a fresh profile each), the best kept


def _profiled_tiny_loop(which: str, cuda_only: bool = False) -> tuple:
    """(the profile, the loop's seconds under it, the clock when its stop began, when it ended)."""
    import torch

    profiler = _profiler(which)
    tiny_loop(torch, 1000)
    acts = [profiler.ProfilerActivity.CUDA]
    prof = profiler.profile(activities=acts if cuda_only else [profiler.ProfilerActivity.CPU, *acts])
    prof.__enter__()
    seconds = tiny_loop(torch)
    t0 = time.perf_counter()
    prof.__exit__(None, None, None)
    return prof, seconds, t0, time.perf_counter()


def _best_profiled_loop(which: str, out: str, cuda_only: bool = False) -> dict:
    """The fastest of PROFILED_RUNS profiled loops, with its stop-to-trace-written time."""
    best = None
    for _ in range(PROFILED_RUNS):
        prof, seconds, t0, t1 = _profiled_tiny_loop(which, cuda_only)
        prof.export_chrome_trace(out)
        run = {"seconds": seconds, "stop_to_written_s": time.perf_counter() - t0, "stop_s": t1 - t0}
        if best is None or seconds < best[0]["seconds"]:
            best = (run, prof)
        del prof
    assert best is not None
    return best


@CHECK.part
def c_torch(out):
    run, _ = _best_profiled_loop("torch", out)
    return run


@CHECK.part
def c_polyprof(out):
    run, prof = _best_profiled_loop("polyprof", out)
    cuda = prof.trace.backends["cuda"]
    return {
        **run,
        "n_kernels": trace_summary(load(out))["n_kernels"],
        "cuda_activities": cuda.activities,
        "records_per_s_at_stop": cuda.activities / max(run["stop_s"], 1e-9),
        "cuda_status": cuda.to_json(),
        "postprocess_ms": _postprocess_ms(prof.trace),
    }


INTERLEAVED_ROUNDS = 5


@CHECK.part
def c_interleaved(out):
    """Unprofiled, torch.profiler and polyprof loops taken in turns in one process, INTERLEAVED_ROUNDS
    rounds (the two profilers' order alternating), so that the GPU's and the host's drifts between
    separate processes do not decide the ratio. Both profilers coexist in one process (checked by
    a_after_torch_profiler and a_torch_after_polyprof)."""
    import torch

    tiny_loop(torch, 1000)
    seconds: dict[str, list[float]] = {"unprofiled": [], "torch": [], "polyprof": []}
    stop_to_written: dict[str, list[float]] = {"torch": [], "polyprof": []}
    for r in range(INTERLEAVED_ROUNDS):
        seconds["unprofiled"].append(tiny_loop(torch))
        for which in ("torch", "polyprof") if r % 2 == 0 else ("polyprof", "torch"):
            prof, took, t0, _ = _profiled_tiny_loop(which)
            prof.export_chrome_trace(out)
            stop_to_written[which].append(time.perf_counter() - t0)
            seconds[which].append(took)
            del prof
    return {"seconds": seconds, "stop_to_written_s": stop_to_written}


# -- diagnostics: what the next change needs to know (reported raw) -------------------------------
@CHECK.part
def x_cuda_only_torch(out):
    """torch.profiler [CUDA] alone: CUPTI's share of the overhead, without recording ops."""
    return _best_profiled_loop("torch", out, cuda_only=True)[0]


@CHECK.part
def x_cuda_only_polyprof(out):
    run, prof = _best_profiled_loop("polyprof", out, cuda_only=True)
    return {**run, "postprocess_ms": _postprocess_ms(prof.trace)}


@CHECK.part
def x_stop_profile(out):
    """cProfile of polyprof's stop and export after the loop: where the time goes."""
    import cProfile
    import io
    import pstats

    import torch

    import polyprof.profiler as profiler

    tiny_loop(torch, 1000)
    prof = profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.CUDA])
    prof.__enter__()
    tiny_loop(torch)
    pr = cProfile.Profile()
    pr.enable()
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(out)
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("cumulative").print_stats(35)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    return {"postprocess_ms": _postprocess_ms(prof.trace), "profile": lines[:60]}


def _cupti_maps() -> list[str]:
    with open("/proc/self/maps") as f:
        return sorted({ln.split()[-1] for ln in f if "cupti" in ln.lower() and "/" in ln})


def _coexist(order: str) -> dict:
    """polyprof [CUDA] beside torch's own profiler enabled CPU-only (what the with_stack path does), in
    each order of starting and stopping: which one keeps CUPTI's records."""
    import torch
    from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

    import polyprof
    from polyprof.model import ActivityKind

    cfg = ProfilerConfig(ProfilerState.KINETO, False, False, True, False, False, _ExperimentalConfig(), "")
    cpu = {ProfilerActivity.CPU}
    torch_workload(torch, graph=False)
    prof = polyprof.profile(["cuda"])

    def torch_on():
        _prepare_profiler(cfg, cpu)
        _enable_profiler(cfg, cpu)

    if order.startswith("torch_first"):
        torch_on()
        prof.__enter__()
    else:
        prof.__enter__()
        if order != "alone":
            torch_on()
    torch_workload(torch, graph=False)
    if order.endswith("torch_stops_first"):
        n_ops = len(_disable_profiler().events())
        prof.__exit__(None, None, None)
    else:
        prof.__exit__(None, None, None)
        n_ops = len(_disable_profiler().events()) if order != "alone" else 0
    cuda = prof.trace.backends["cuda"]
    return {
        "kernels": len(prof.trace.activities_of(ActivityKind.KERNEL)),
        "torch_events": n_ops,
        "cuda": cuda.to_json(),
        "cupti_libraries": _cupti_maps(),
    }


@CHECK.part
def e_nvml(out):
    """GPU counters through NVML (the nvml backend, nvidia-ml-py) while torch keeps the GPU busy: every
    track sampled, SM utilisation above 0 under load, the tracks on the cuda backend's GPU process."""
    import torch

    from polyprof.profiler import ProfilerActivity, profile

    x = torch.randn(4096, 4096, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], backend_options={"nvml": {"interval_ms": 20}}) as prof:
        end = time.time() + 1.0
        while time.time() < end:
            x = x @ x
            x = x / x.norm()
        torch.cuda.synchronize()
    trace = prof.trace
    cols, names = trace.counters.columns, trace.counters.strings.strings
    tracks = {}
    for code, dev, value in zip(cols["name"].tolist(), cols["device"].tolist(), cols["value"].tolist(), strict=True):
        tracks.setdefault(f"{trace.devices[dev].key} {names[code]}", []).append(value)
    kernels_on = {trace.devices[int(d)].key for d, k in zip(trace.activities["device"], trace.activities["kind"], strict=True) if int(k) == 3}
    status = trace.backends.get("nvml")
    return {
        "tracks": {k: {"samples": len(v), "max": max(v)} for k, v in sorted(tracks.items())},
        "sm_busy": max(tracks.get("cuda:0 SM utilisation %", [0])) > 0,
        "same_process_as_kernels": "cuda:0" in kernels_on,
        "unsupported": (status.details.get("unsupported") if status else "no nvml backend"),
        "state": status.state if status else None,
    }


@CHECK.part
def f_annotations(out):
    """Kernels launched under record_function opened each way (a with block in plain code, the C
    decorator, spans inside interleaved asyncio tasks) land under their span: each kernel's launch (the
    runtime row of its correlation) is inside the span on its thread, and the spans are all there. Since
    issue #21 spans of plain code leave the context variable alone, tasks set it, the decorator is C."""
    import asyncio

    import torch

    import polyprof
    from polyprof.model import ActivityKind
    from polyprof.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256, device="cuda")

    @polyprof.record_function("decorated")
    def decorated():
        return x.sin()

    async def task(name):
        with polyprof.record_function(name):
            y = x.cos()
            await asyncio.sleep(0.01)
            return y.exp()

    async def main():
        return await asyncio.gather(task("task a"), task("task b"))

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with polyprof.record_function("with block"):
            x.tanh()
        decorated()
        with polyprof.record_function("around asyncio.run"):
            asyncio.run(main())
        torch.cuda.synchronize()
    acts = list(prof.trace.activities)
    spans = [a for a in acts if a.kind == ActivityKind.USER_ANNOTATION]
    launch_of = {a.correlation: a for a in acts if a.kind == ActivityKind.RUNTIME and a.correlation}
    under = Counter()
    for k in (a for a in acts if a.kind == ActivityKind.KERNEL):
        launch = launch_of.get(k.correlation)
        around = [s for s in spans if launch is not None and s.resource == launch.resource
                  and s.start <= launch.start <= s.end]
        for s in around:
            under[s.name] += 1
    return {
        "spans": sorted(s.name for s in spans),
        "kernels_launched_under": dict(under),
        "ok": under["with block"] >= 1 and under["decorated"] >= 1 and under["around asyncio.run"] >= 4
        and under["task a"] >= 2 and under["task b"] >= 2,
    }


def _lightning_fit(out: str, behind_torch: bool) -> dict:
    """tests/frameworks/lightning_fit.py's fit (Lightning's PyTorchProfiler with a schedule, chrome
    export) on the GPU, without its OpenCL work; the summary of every trace Lightning wrote."""
    import glob

    import polyprof

    if behind_torch:
        polyprof.install_torch_profiler()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "frameworks"))
    from lightning_fit import fit

    folder = out + ".lightning"
    fit(folder, accelerator="gpu", opencl=False)
    docs = [load(p) for p in sorted(glob.glob(os.path.join(folder, "*.json")))]
    events = [e for d in docs for e in d["traceEvents"]]
    return {
        "traces": len(docs),
        "polyprof_traces": sum(1 for d in docs if "polyprof" in d),
        "aten_ops": sorted({e["name"] for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")}),
        "kernels": Counter(e["name"] for e in events if e.get("cat") == "kernel"),
        "backends": polyprof_status(docs[0]) if docs and "polyprof" in docs[0] else {},
    }


@CHECK.part
def g_lightning_polyprof(out):
    return _lightning_fit(out, behind_torch=True)


@CHECK.part
def g_lightning_torch(out):
    return _lightning_fit(out, behind_torch=False)


for _order in ("alone", "polyprof_first_torch_stops_first", "torch_first", "torch_first_torch_stops_first"):
    CHECK.parts[f"x_coexist_{_order}"] = lambda out, order=_order: _coexist(order)


@CHECK.part
def x_preallocate(out):
    """Which buffer attributes CUPTI accepts, before any CUDA context and after one exists."""
    import ctypes

    from cupti import cupti

    def try_all():
        got = {}
        for name in (
            "DEVICE_BUFFER_PRE_ALLOCATE_VALUE",
            "PROFILING_SEMAPHORE_PRE_ALLOCATE_VALUE",
            "DEVICE_BUFFER_SIZE",
            "DEVICE_BUFFER_POOL_LIMIT",
        ):
            attr = getattr(cupti.ActivityAttribute, name, None) or getattr(
                cupti.ActivityAttribute, "ATTR_" + name, None
            )
            if attr is None:
                got[name] = "no such attribute in cupti-python"
                continue
            size, value = (
                ctypes.c_size_t(8),
                ctypes.c_size_t(4 if "VALUE" in name or "LIMIT" in name else 8 << 20),
            )
            try:
                cupti.activity_set_attribute(int(attr), ctypes.addressof(size), ctypes.addressof(value))
                got[name] = "ok"
            except Exception as exc:
                got[name] = f"{type(exc).__name__}: {exc}"
        return got

    before = try_all()
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return {"before_any_context": before, "after_a_context": try_all()}


# -- running and reporting ------------------------------------------------------------------------
def _counter_diff(a: dict, b: dict, limit: int = 8) -> str:
    only_a = Counter(a) - Counter(b)
    return ", ".join(f"{k} x{v}" for k, v in only_a.most_common(limit)) or "none"


def _error_lines(name: str, result: dict) -> list[str]:
    """A failed part: the end of its error (a traceback's last frames and message)."""
    text = "\n".join(result["error"].strip().splitlines()[-12:]).replace("```", "'''")
    return [f"- {name}: **failed**", "", "```", text, "```"]


def build_report(res: dict) -> str:
    """The markdown report from the parts' results (each a dict, or {"error": text})."""
    return "\n".join(["# polyprof-cuda device check", "", *report_lines(res)]) + "\n"


def report_lines(res: dict) -> list[str]:
    """The report's lines after its title: every part's verdict."""
    lines = []
    env_ = res.get("env", {})
    lines += ["## Environment"]
    lines += _error_lines("env", env_) if "error" in env_ else [f"- {k}: {v}" for k, v in env_.items()]

    lines += ["", "## (a) torch workload: polyprof vs torch.profiler, [CPU, CUDA]"]
    pa, ta = res.get("a_polyprof", {"error": "not run"}), res.get("a_torch", {"error": "not run"})
    if "error" in pa or "error" in ta:
        for name, r in (("polyprof", pa), ("torch.profiler", ta)):
            if "error" in r:
                lines += _error_lines(name, r)
    else:
        n = pa["n_kernels"]
        same = pa["kernels"] == ta["kernels"]
        agree = sum((Counter(pa["attribution"]) & Counter(ta["attribution"])).values())
        lines += [
            f"- kernel names identical (multiset): **{same}** ({n} vs {ta['n_kernels']} kernels)",
            f"- memcpy {pa['memcpy']} vs {ta['memcpy']}; memset {pa['memset']} vs {ta['memset']}",
            f"- kernels with an ac2g flow from their launch: polyprof {pa['kernels_with_flow']}/{n}, "
            f"torch.profiler {ta['kernels_with_flow']}/{ta['n_kernels']}",
            f"- kernels whose External id names an aten op: polyprof {pa['kernels_charged_to_op']}/{n}, "
            f"torch.profiler {ta['kernels_charged_to_op']}/{ta['n_kernels']}",
            f"- (op -> kernel) attribution identical to torch.profiler's for **{agree}/{n}** kernels",
            f"- polyprof backends: {json.dumps(pa['backends'])}",
        ]
        if not same:
            lines.append(f"- kernels only in polyprof: {_counter_diff(pa['kernels'], ta['kernels'])}")
            lines.append(f"- kernels only in torch.profiler: {_counter_diff(ta['kernels'], pa['kernels'])}")
        if agree != n:
            lines.append(
                f"- attributed only by polyprof: {_counter_diff(pa['attribution'], ta['attribution'])}"
            )
            lines.append(f"- attributed only by torch: {_counter_diff(ta['attribution'], pa['attribution'])}")
    pc = res.get("a_polyprof_collector", {"error": "not run"})
    if "error" in pc:
        lines += _error_lines("with_stack=True (the observer's stacks, the python backend's frames)", pc)
    else:
        lines.append(
            f"- with_stack=True (torch's collector records ops): {pc['n_kernels']} kernels reached polyprof, "
            f"{pc['kernels_with_flow']} with a flow, {pc['kernels_charged_to_op']} charged to an aten op; "
            f"backends: {json.dumps(pc['backends'])}"
        )

    for name, label in (
        ("a_after_torch_profiler", "polyprof after torch.profiler in one process"),
        ("a_torch_after_polyprof", "torch.profiler after polyprof in one process"),
    ):
        r = res.get(name)
        if r is None:
            continue
        if "error" in r:
            lines += _error_lines(label, r)
        else:
            lines.append(
                f"- {label}: {r['n_kernels']} kernels, {r['kernels_with_flow']} with a flow, "
                f"{r['kernels_charged_to_op']} charged to an aten op"
            )

    lines += ["", "## (b) other CUDA code"]
    for name, label in (
        ("b_cupy", "CuPy"),
        ("b_numba", "Numba"),
        ("b_cuda_python", "cuda-python (cuda.bindings + NVRTC)"),
        ("b_jax", "JAX"),
        ("b_triton", "Triton (torch tensors)"),
    ):
        r = res.get(name, {"error": "not run"})
        if "error" in r:
            lines += _error_lines(label, r)
            continue
        torch_note = "" if "torch_imported" not in r else f", torch imported: {r['torch_imported']}"
        lines.append(
            f"- {label}: {r['n_kernels']} kernels ({', '.join(sorted(r['kernels'])[:4])}), "
            f"{r['memcpy']} copies, {r['kernels_with_flow']}/{r['n_kernels']} with a flow from their launch, "
            f"result correct: {r.get('result_ok')}{torch_note}"
            + (
                " (numpy.row_stack alias added for the machine's numba-cuda)"
                if r.get("numpy_row_stack_alias_added")
                else ""
            )
        )

    lines += ["", f"## (c) {TINY_KERNELS:,} tiny kernels (launch-bound)"]
    cu, ct, cp = (res.get(k, {"error": "not run"}) for k in ("c_unprofiled", "c_torch", "c_polyprof"))
    failed = [
        (k, r) for k, r in (("unprofiled", cu), ("torch.profiler", ct), ("polyprof", cp)) if "error" in r
    ]
    if failed:
        for name, r in failed:
            lines += _error_lines(name, r)
    else:
        base = cu["seconds"]
        over_t = ct["seconds"] - base
        ratio_text = (
            f"**{(cp['seconds'] - base) / over_t:.2f}**"
            if over_t > 0
            else "n/a (the unprofiled run, another process, was the slowest: see (c'))"
        )
        took = cp.get("postprocess_ms") or {}
        collect_ms = (took.get("cuda") or {}).get("collect")
        lines += [
            f"- best of {PROFILED_RUNS} runs each: unprofiled {base * 1e3:.1f} ms; torch.profiler "
            f"{ct['seconds'] * 1e3:.1f} ms ({ct['seconds'] / base:.2f}x); polyprof {cp['seconds'] * 1e3:.1f} ms "
            f"({cp['seconds'] / base:.2f}x)",
            f"- overhead ratio polyprof/torch.profiler: {ratio_text} (target <= 1.0); "
            f"polyprof kept {cp['n_kernels']} kernels",
            "",
            "## (d) stop to trace written",
            f"- torch.profiler {ct['stop_to_written_s'] * 1e3:.1f} ms; polyprof {cp['stop_to_written_s'] * 1e3:.1f} ms",
            f"- polyprof's stop, by backend and phase (ms): {json.dumps(took)}",
        ]
        decode_ms = (cp["cuda_status"].get("details", {}).get("stop_ms") or {}).get("decode")
        if collect_ms:
            processing_ms = collect_ms + (decode_ms or 0.0)
            lines.append(
                f"- polyprof CUDA records decoded (at stop) and collected: {cp['cuda_activities']} in "
                f"{processing_ms:.1f} ms = **{cp['cuda_activities'] / processing_ms / 1e3:.2f} M/s** "
                f"(target >= 1 M/s); CUPTI's flush and disable took the rest of the cuda stop"
            )
        lines.append(f"- polyprof cuda backend: {json.dumps(cp['cuda_status'])}")
    ci = res.get("c_interleaved")
    if ci is not None:
        lines += [
            "",
            f"## (c') the same loops in one process, {INTERLEAVED_ROUNDS} interleaved rounds (medians)",
        ]
        if "error" in ci:
            lines += _error_lines("interleaved loops", ci)
        else:
            med = {k: sorted(v)[len(v) // 2] for k, v in ci["seconds"].items()}
            base = med["unprofiled"]
            over_t, over_p = med["torch"] - base, med["polyprof"] - base
            ratio = (
                f"**{over_p / over_t:.2f}**"
                if over_t > 0
                else "n/a (torch.profiler's overhead is within noise)"
            )
            stops = {k: sorted(v)[len(v) // 2] for k, v in ci["stop_to_written_s"].items()}
            lines += [
                f"- unprofiled {base * 1e3:.1f} ms; torch.profiler {med['torch'] * 1e3:.1f} ms "
                f"({med['torch'] / base:.2f}x); polyprof {med['polyprof'] * 1e3:.1f} ms ({med['polyprof'] / base:.2f}x)",
                f"- overhead ratio polyprof/torch.profiler: {ratio} (target <= 1.0)",
                f"- stop to trace written: torch.profiler {stops['torch'] * 1e3:.1f} ms; polyprof "
                f"{stops['polyprof'] * 1e3:.1f} ms",
                f"- every round (ms): {json.dumps({k: [round(x * 1e3, 1) for x in v] for k, v in ci['seconds'].items()})}",
            ]
    lines += ["", "## (g) Lightning on the GPU, polyprof behind torch.profiler"]
    gp, gt = res.get("g_lightning_polyprof", {"error": "not run"}), res.get("g_lightning_torch", {"error": "not run"})
    if "error" in gp or "error" in gt:
        for name, r in (("with polyprof behind torch.profiler", gp), ("with torch.profiler", gt)):
            if "error" in r:
                lines += _error_lines(name, r)
    else:
        lines += [
            f"- Lightning wrote {gp['traces']} traces, {gp['polyprof_traces']} of them polyprof's (torch.profiler's "
            f"run: {gt['traces']})",
            f"- aten ops identical to torch.profiler's: **{gp['aten_ops'] == gt['aten_ops']}** "
            f"({len(gp['aten_ops'])} vs {len(gt['aten_ops'])})",
            f"- kernel names identical (multiset): **{Counter(gp['kernels']) == Counter(gt['kernels'])}** "
            f"({sum(gp['kernels'].values())} vs {sum(gt['kernels'].values())} kernels)",
            f"- polyprof backends: {json.dumps(gp['backends'])}",
        ]
    lines += ["", "## (h) The flight recorder with CUDA"]
    hf = res.get("h_flight", {"error": "not run"})
    if "error" in hf:
        lines += _error_lines("h_flight", hf)
    else:
        caps = hf["captures"]
        lines += [
            f"- slow_step captured with kernels: **{caps.get('slow_step', {}).get('kernels', 0) > 0}** "
            f"({json.dumps(caps.get('slow_step', {}).get('evidence'))})",
            f"- oom raised: {hf['oom_raised']}; oom captured: **{'oom' in caps}** ({json.dumps(caps.get('oom', {}).get('evidence'))})",
            f"- write seconds: {hf['write_s']}; failures: {hf['failures']}",
        ]
    diagnostics = [name for name in res if name.startswith("x_")]
    if diagnostics:
        lines += ["", "## Diagnostics (raw)"]
        for name in diagnostics:
            r = res[name]
            if "error" in r:
                lines += _error_lines(name, r)
            elif "profile" in r:
                lines += [f"- {name}: {json.dumps(r['postprocess_ms'])}", "", "```", *r["profile"], "```"]
            else:
                lines.append(f"- {name}: {json.dumps(r, default=json_default)}")
    return lines


def main():
    CHECK.main(add_arguments=lambda ap: ap.add_argument(
        "--keep-traces", metavar="DIR", help=f"copy the traces of {', '.join(KEPT_TRACES)} here, gzipped"),
        finished=lambda args, folder, results: args.keep_traces and _keep_traces(folder, args.keep_traces))


def _keep_traces(folder: str, into: str) -> None:
    """Gzipped copies of the traces worth reading after the GPU is given back."""
    for name in KEPT_TRACES:
        source = os.path.join(folder, f"{name}.json")
        if os.path.exists(source):
            with open(source, "rb") as f, gzip.open(os.path.join(into, f"{name}.json.gz"), "wb") as g:
                shutil.copyfileobj(f, g)


if __name__ == "__main__":
    main()
