#!/usr/bin/env python3
"""GPU check for polyprof-cuda: run on a machine with one NVIDIA GPU, torch (CUDA build) and cupti-python.

    python plugins/polyprof-cuda/scripts/device-check.py [--out report.md]

Parts (each in its own process, so that torch.profiler's CUPTI subscriber cannot disturb polyprof's):
  (a) a torch workload (matmuls, elementwise ops, H2D/D2H copies, a memset, a CUDA graph replay) traced
      by polyprof [CPU, CUDA] and by torch.profiler [CPU, CUDA]: same multiset of kernel names, same
      memcpy/memset counts, every kernel with a flow from its launch and an External id naming an aten op;
  (b) a CuPy workload without torch: its kernels and copies appear (skipped if CuPy is missing);
  (c) a launch-bound loop of 10,000 tiny kernels: wall time unprofiled, under torch.profiler, under
      polyprof, and the ratios;
  (d) stop-to-trace-written time for both, and polyprof's records processed per second at collect.
Writes a markdown report (stdout, and --out / $OUT/device-check-report.md when given).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

PARTS = {}


def part(fn):
    PARTS[fn.__name__] = fn
    return fn


def torch_workload(torch, graph=True):
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    host = torch.randn(1 << 20).pin_memory()
    for _ in range(3):
        c = (a @ b).relu() + 1.0
        d = host.to("cuda", non_blocking=True)
        c.zero_()
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


def kineto_summary(doc):
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    starts = {e["id"] for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"] for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    ops = {e["args"].get("External id") for e in events if e.get("cat") == "cpu_op" and "args" in e}
    return {
        "kernels": Counter(e["name"] for e in kernels),
        "memcpy": sum(1 for e in events if e.get("cat") == "gpu_memcpy"),
        "memset": sum(1 for e in events if e.get("cat") == "gpu_memset"),
        "kernels_with_flow": sum(
            1 for e in kernels if e.get("args", {}).get("correlation") in (starts & ends)
        ),
        "kernels_with_op_external_id": sum(1 for e in kernels if e.get("args", {}).get("External id") in ops),
        "n_kernels": len(kernels),
    }


@part
def a_polyprof(out):
    import torch

    from polyprof.profiler import ProfilerActivity, profile

    torch_workload(torch)  # warm up (cuBLAS handles, graph capture pools)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch_workload(torch)
    prof.export_chrome_trace(out)
    doc = json.load(open(out))
    s = kineto_summary(doc)
    s["backends"] = doc["polyprof"]["backends"]
    return s


@part
def a_torch(out):
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch_workload(torch)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch_workload(torch)
    prof.export_chrome_trace(out)
    return kineto_summary(json.load(open(out)))


@part
def b_cupy(out):
    try:
        import cupy as cp
    except ImportError as exc:
        return {"skipped": f"CuPy not installed ({exc})"}
    import polyprof

    x = cp.arange(1 << 20, dtype=cp.float32)
    with polyprof.profile(["cpu", "cuda"]) as prof:
        y = cp.sin(x) * 2
        z = cp.asnumpy(y)
        cp.cuda.Device().synchronize()
    prof.export_chrome_trace(out)
    s = kineto_summary(json.load(open(out)))
    s["torch_imported"] = "torch" in sys.modules
    s["result_ok"] = bool(abs(float(z[1]) - 2 * __import__("math").sin(1.0)) < 1e-4)
    return s


def tiny_loop(torch, n=10_000):
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


@part
def c_unprofiled(out):
    import torch

    tiny_loop(torch, 1000)
    return {"seconds": min(tiny_loop(torch) for _ in range(3))}


@part
def c_torch(out):
    import torch
    from torch.profiler import ProfilerActivity, profile

    tiny_loop(torch, 1000)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    seconds = tiny_loop(torch)
    t0 = time.perf_counter()
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(out)
    return {"seconds": seconds, "stop_to_written_s": time.perf_counter() - t0}


@part
def c_polyprof(out):
    import torch

    from polyprof.profiler import ProfilerActivity, profile

    tiny_loop(torch, 1000)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    seconds = tiny_loop(torch)
    t0 = time.perf_counter()
    prof.__exit__(None, None, None)
    t1 = time.perf_counter()
    prof.export_chrome_trace(out)
    cuda = prof.trace.backends["cuda"]
    return {
        "seconds": seconds,
        "stop_to_written_s": time.perf_counter() - t0,
        "stop_s": t1 - t0,
        "cuda_activities": cuda.activities,
        "records_per_s_at_stop": cuda.activities / max(t1 - t0, 1e-9),
        "cuda_status": cuda.to_json(),
    }


def run_part(name, folder):
    out = os.path.join(folder, f"{name}.json")
    r = subprocess.run(
        [sys.executable, __file__, "--part", name, "--trace", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part")
    ap.add_argument("--trace")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.part:
        result = PARTS[args.part](args.trace)
        print(json.dumps(result, default=lambda o: dict(o) if isinstance(o, Counter) else str(o)))
        return
    folder = tempfile.mkdtemp()
    res = {name: run_part(name, folder) for name in PARTS}
    lines = ["# polyprof-cuda device check", ""]
    try:
        import torch

        lines.append(
            f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; CUDA {torch.version.cuda}"
        )
    except Exception as exc:
        lines.append(f"torch/CUDA not available: {exc}")
    pa, ta = res["a_polyprof"], res["a_torch"]
    lines += ["", "## (a) torch workload, polyprof vs torch.profiler"]
    if "error" in pa or "error" in ta:
        lines.append(f"error: polyprof: {pa.get('error', '')}\ntorch: {ta.get('error', '')}")
    else:
        same = pa["kernels"] == ta["kernels"]
        lines += [
            f"- kernel names identical (multiset): **{same}** ({pa['n_kernels']} vs {ta['n_kernels']} kernels)",
            f"- memcpy {pa['memcpy']} vs {ta['memcpy']}; memset {pa['memset']} vs {ta['memset']}",
            f"- polyprof kernels with an ac2g flow: {pa['kernels_with_flow']}/{pa['n_kernels']}; with an aten op's External id: {pa['kernels_with_op_external_id']}/{pa['n_kernels']}",
            f"- polyprof backends: {json.dumps(pa['backends'])}",
        ]
        if not same:
            lines.append(
                f"- only in polyprof: {dict(Counter(pa['kernels']) - Counter(ta['kernels']))}; only in torch: {dict(Counter(ta['kernels']) - Counter(pa['kernels']))}"
            )
    lines += ["", "## (b) CuPy without torch", f"- {json.dumps(res['b_cupy'])}"]
    cu, ct, cp_ = res["c_unprofiled"], res["c_torch"], res["c_polyprof"]
    lines += ["", "## (c) 10,000 tiny kernels"]
    if any("error" in x for x in (cu, ct, cp_)):
        lines.append(f"error: {cu.get('error', '')} {ct.get('error', '')} {cp_.get('error', '')}")
    else:
        base = cu["seconds"]
        lines += [
            f"- unprofiled {base * 1e3:.1f} ms; torch.profiler {ct['seconds'] * 1e3:.1f} ms ({ct['seconds'] / base:.2f}x); "
            f"polyprof {cp_['seconds'] * 1e3:.1f} ms ({cp_['seconds'] / base:.2f}x)",
            f"- overhead ratio polyprof/torch: {(cp_['seconds'] - base) / max(ct['seconds'] - base, 1e-9):.2f} (target <= 1.0)",
            "",
            "## (d) stop to trace written",
            f"- torch.profiler {ct['stop_to_written_s'] * 1e3:.1f} ms; polyprof {cp_['stop_to_written_s'] * 1e3:.1f} ms",
            f"- polyprof CUDA records processed at stop: {cp_['cuda_activities']} in {cp_['stop_s'] * 1e3:.1f} ms = {cp_['records_per_s_at_stop'] / 1e6:.2f} M/s (target >= 1 M/s)",
        ]
    report = "\n".join(lines) + "\n"
    print(report)
    target = args.out or (
        os.path.join(os.environ["OUT"], "device-check-report.md") if os.environ.get("OUT") else None
    )
    if target:
        with open(target, "w") as f:
            f.write(report)
            f.write(
                "\n<details><summary>raw</summary>\n\n```json\n"
                + json.dumps(res, indent=1, default=str)
                + "\n```\n</details>\n"
            )


if __name__ == "__main__":
    main()
