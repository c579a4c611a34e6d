"""PyTorch overhead over one long profile: N tiny operators (``x.neg()`` on 4 floats) recorded in one
window, as a profile kept on a training job records them, unprofiled, under polyprof.profiler and
under torch.profiler (CPU), in the same run.

    .venv/bin/python benchmarks/probes/torch_long_profile.py [--ops 1000000] [--batches 9] [--record-shapes]

torch_overhead.py times 4,000-op windows, each a fresh profile; here the buffers grow past their
first chunk, so what a long window pays per operator (its rows' pages, the clock) shows. Reports the
median over batches of the wall time per op in each case, and the added time per op ((profiled -
unprofiled), the unprofiled time measured before and after each profile), with polyprof's over
torch.profiler's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: _common

from _common import report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=1_000_000, help="operators per profile")
    ap.add_argument("--batches", type=int, default=9, help="the profile's operators timed in this many batches")
    ap.add_argument("--record-shapes", action="store_true", help="profile both with record_shapes=True")
    args = ap.parse_args()
    import torch

    import polyprof.profiler as pp

    x = torch.ones(4)
    per_batch = args.ops // args.batches

    def batch() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(per_batch):
            x.neg()
        return (time.perf_counter_ns() - t0) / per_batch

    def window() -> float:
        return statistics.median(batch() for _ in range(args.batches))

    window()  # warm up
    added: dict[str, float] = {}
    plain: list[float] = []
    for name, make in (
        ("polyprof", lambda: pp.profile(activities=[pp.ProfilerActivity.CPU], record_shapes=args.record_shapes)),
        ("torch", lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=args.record_shapes)),
    ):
        before = window()
        with make():
            profiled = window()
        after = window()
        plain += [before, after]
        added[name] = profiled - (before + after) / 2
    report(
        "torch_long_profile",
        {
            "ops_per_profile": per_batch * args.batches,
            "record_shapes": args.record_shapes,
            "torch_version": torch.__version__,
            "plain_ns_per_op": round(statistics.median(plain), 1),
            "added_ns_per_op": {k: round(v, 1) for k, v in added.items()},
            "ratio_added_per_op_polyprof_over_torch": round(added["polyprof"] / added["torch"], 3),
        },
    )


if __name__ == "__main__":
    main()
