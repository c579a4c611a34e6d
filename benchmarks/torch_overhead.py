"""PyTorch overhead: a 20-layer MLP (batch 8), 20 forward passes, unprofiled, under torch.profiler (CPU)
and under polyprof.profiler (CPU), in the same run.

    .venv/bin/python benchmarks/torch_overhead.py [--repeats 15] [--record-shapes]

Reports medians over the repeats of: wall time of the 20 passes; added time per recorded operator
((profiled - unprofiled) / operators in the trace); stop-to-trace-written time (leaving the profile
context, which stops and processes, plus export_chrome_trace). Targets (issue #4): polyprof's added time
per operator at most torch.profiler's (1.0x), and its stop-to-trace-written time at most 1/3 of torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _common import mlp_inference, report, scratch_folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--record-shapes", action="store_true", help="profile both with record_shapes=True")
    ap.add_argument("--spill", action="store_true", help="polyprof with a spill (crash-safe capture) on")
    ap.add_argument("--with-stack", action="store_true", help="profile both with with_stack=True")
    args = ap.parse_args()
    import torch

    import polyprof.profiler as pp

    work = mlp_inference(args.passes)
    work()  # warm up
    folder = scratch_folder()
    samples: dict[str, list[float]] = {
        k: [] for k in ("plain", "torch", "polyprof", "torch_stop", "polyprof_stop")
    }
    ops: dict[str, int] = {}

    def run_torch(r: int) -> None:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=args.record_shapes,
            with_stack=args.with_stack,
        )
        prof.__enter__()
        t0 = time.perf_counter_ns()
        work()
        samples["torch"].append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        prof.__exit__(None, None, None)
        path = os.path.join(folder, f"torch{r}.json")
        prof.export_chrome_trace(path)
        samples["torch_stop"].append(time.perf_counter_ns() - t0)
        with open(path) as f:
            ops["torch"] = sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op")
        os.remove(path)  # see _common.scratch_folder: the next trace's pages are not fresh ones

    def run_polyprof(r: int) -> None:
        spill = os.path.join(folder, f".run{r}.spill") if args.spill else None
        prof = pp.profile(activities=[pp.ProfilerActivity.CPU], record_shapes=args.record_shapes, spill=spill,
                          with_stack=args.with_stack)
        prof.__enter__()
        t0 = time.perf_counter_ns()
        work()
        samples["polyprof"].append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        prof.__exit__(None, None, None)
        path = os.path.join(folder, f"polyprof{r}.json")
        prof.export_chrome_trace(path)
        samples["polyprof_stop"].append(time.perf_counter_ns() - t0)
        os.remove(path)
        ops["polyprof"] = int((prof.trace.activities["kind"] == 0).sum())

    for r in range(args.repeats):
        t0 = time.perf_counter_ns()
        work()
        samples["plain"].append(time.perf_counter_ns() - t0)
        first, second = (
            (run_torch, run_polyprof) if r % 2 == 0 else (run_polyprof, run_torch)
        )  # no order bias
        first(r)
        second(r)
    med = {k: statistics.median(v) for k, v in samples.items()}
    added_torch = (med["torch"] - med["plain"]) / ops["torch"]
    added_polyprof = (med["polyprof"] - med["plain"]) / ops["polyprof"]
    results = {
        "torch_version": torch.__version__,
        "repeats": args.repeats,
        "record_shapes": args.record_shapes,
        "with_stack": args.with_stack,
        "operators_per_run": ops,
        "wall_ms": {k: round(med[k] / 1e6, 3) for k in ("plain", "torch", "polyprof")},
        "added_ns_per_op": {"torch": round(added_torch), "polyprof": round(added_polyprof)},
        "ratio_added_per_op_polyprof_over_torch": round(added_polyprof / added_torch, 3),
        "stop_to_trace_written_ms": {
            "torch": round(med["torch_stop"] / 1e6, 2),
            "polyprof": round(med["polyprof_stop"] / 1e6, 2),
        },
        "ratio_stop_polyprof_over_torch": round(med["polyprof_stop"] / med["torch_stop"], 3),
        "targets": {"added_per_op_ratio_max": 1.0, "stop_ratio_max": round(1 / 3, 3)},
    }
    results["meets_targets"] = (
        results["ratio_added_per_op_polyprof_over_torch"] <= 1.0
        and results["ratio_stop_polyprof_over_torch"] <= 1 / 3
    )
    report("torch_overhead", results)


if __name__ == "__main__":
    main()
