"""Cost of one record_function enter+exit: polyprof vs torch.profiler, in the same run.

    .venv/bin/python benchmarks/annotation_overhead.py [--n 200000] [--repeats 15]

Reports medians of per-iteration wall time (each batch runs N `with record_function(...)` blocks; the
empty-loop cost is reported separately and not subtracted), beside a bare `with lock:` (the floor of a
`with` statement on a C object) and the decorator form. Targets: polyprof's cost while profiling at most
1/15 of torch.profiler's (issue #2), 1/30 (issue #21); idle at most 1.1x the bare `with lock:`, while
profiling at most 1.5x its own idle cost, `instant` and `counter` while profiling at most 1.5x a plain
Python call (issue #21). Run with POLYPROF_PURE_PYTHON=1 for the fallback (issue #21: at most 1/10 of
torch's), with POLYPROF_CLOCK=gettime for the recorder's clock through clock_gettime.
"""

from __future__ import annotations

import argparse
import gc
import os
import threading

from _common import per_call_ns, report, scratch_folder

import polyprof
from polyprof._native import extension as speedups


def loop_empty(n: int) -> None:
    for _ in range(n):
        pass


def loop_polyprof(n: int) -> None:
    rf = polyprof.record_function
    for _ in range(n):
        with rf("x"):
            pass


def loop_lock(n: int) -> None:
    lock = threading.Lock()
    for _ in range(n):
        with lock:
            pass


@polyprof.record_function("x")
def _decorated() -> None:
    pass


def loop_plain_call(n: int) -> None:
    def plain() -> None:
        pass

    for _ in range(n):
        plain()


def loop_instant(n: int) -> None:
    instant = polyprof.instant
    for _ in range(n):
        instant("x")


def loop_counter(n: int) -> None:
    counter = polyprof.counter
    for _ in range(n):
        counter("x", 1.0)


def loop_decorated(n: int) -> None:
    for _ in range(n):
        _decorated()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--spill", action="store_true", help="profile with a spill (crash-safe capture) on")
    ap.add_argument("--counters", action="store_true", help="also run the counters backend (psutil) at its default rate")
    args = ap.parse_args()
    groups = ["cpu", "counters"] if args.counters else ["cpu"]
    spill = os.path.join(scratch_folder(), ".bench.spill") if args.spill else None
    n, reps = args.n, args.repeats
    gc.collect()
    results: dict = {"n_per_batch": n, "repeats": reps, "c_hot_path": speedups is not None}
    results["empty_loop_ns"] = round(per_call_ns(loop_empty, n, reps), 1)
    results["bare_with_lock_ns"] = round(per_call_ns(loop_lock, n, reps), 1)
    results["polyprof_not_profiling_ns"] = round(per_call_ns(loop_polyprof, n, reps), 1)
    results["plain_call_ns"] = round(per_call_ns(loop_plain_call, n, reps), 1)
    results["decorated_call_not_profiling_ns"] = round(per_call_ns(loop_decorated, n, reps), 1)
    with polyprof.profile(groups, spill=spill) as prof:
        results["polyprof_profiling_ns"] = round(per_call_ns(loop_polyprof, n, reps), 1)
        results["decorated_call_profiling_ns"] = round(per_call_ns(loop_decorated, n, reps), 1)
        results["instant_profiling_ns"] = round(per_call_ns(loop_instant, n, reps), 1)
        results["counter_profiling_ns"] = round(per_call_ns(loop_counter, n, reps), 1)
        if spill:  # let one more flush hand the measured spans to the spill (sized after the profile)
            import time

            time.sleep(prof.flush_interval_s * 2)
            spill_writer = prof._spill
    if spill:
        results["spilled_events"] = spill_writer.rows
        results["spill_bytes_per_event"] = round(os.path.getsize(spill) / max(spill_writer.rows, 1), 1)
    results["idle_over_with_lock"] = round(results["polyprof_not_profiling_ns"] / results["bare_with_lock_ns"], 3)
    results["profiling_over_idle"] = round(results["polyprof_profiling_ns"] / results["polyprof_not_profiling_ns"], 3)
    results["instant_over_plain_call"] = round(results["instant_profiling_ns"] / results["plain_call_ns"], 2)
    results["counter_over_plain_call"] = round(results["counter_profiling_ns"] / results["plain_call_ns"], 2)
    results["spill"] = bool(spill)
    results["counters"] = args.counters
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        results["torch"] = "not installed"
    else:

        def loop_torch(k: int) -> None:
            for _ in range(k):
                with record_function("x"):
                    pass

        # with torch imported, polyprof's record_function also asks whether a torch-side consumer
        # listens (the bridge to torch's RecordFunction): the cost torch users pay
        from polyprof.torch import bridge

        results["bridge_armed"] = bridge._armed is not None
        results["polyprof_not_profiling_torch_imported_ns"] = round(per_call_ns(loop_polyprof, n, reps), 1)
        with polyprof.profile(["cpu"], spill=spill):
            results["polyprof_profiling_torch_imported_ns"] = round(per_call_ns(loop_polyprof, n, reps), 1)
        torch_n = max(n // 10, 1000)  # torch's events are much more expensive to keep
        results["torch_version"] = torch.__version__
        results["torch_not_profiling_ns"] = round(per_call_ns(loop_torch, torch_n, reps), 1)
        with profile(activities=[ProfilerActivity.CPU]):
            results["torch_profiling_ns"] = round(per_call_ns(loop_torch, torch_n, reps), 1)
        results["ratio_polyprof_over_torch"] = round(
            results["polyprof_profiling_ns"] / results["torch_profiling_ns"], 4
        )
        results["decorator_ratio_over_torch"] = round(
            (results["decorated_call_profiling_ns"] - results["plain_call_ns"]) / results["torch_profiling_ns"], 4
        )  # the span's own cost: the decorated call less a plain call
        results["target_ratio"] = round(1 / 15, 4)
        results["meets_target"] = results["ratio_polyprof_over_torch"] <= 1 / 15
        results["issue_21_target_ratio"] = round(1 / 30 if speedups is not None else 1 / 10, 4)
    report("annotation_overhead", results)


if __name__ == "__main__":
    main()
