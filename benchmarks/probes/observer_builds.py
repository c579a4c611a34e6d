"""Two builds of polyprof's torch observer library against each other, in one process, per aten op of
the MLP of torch_overhead.py (`_common.mlp_inference`):

    .venv/bin/python benchmarks/probes/observer_builds.py OLD.so NEW.so [--rounds 80] [--record-shapes]

On a shared VM the added time per op moves by +-100 ns from one process to the next, more than most
changes to the observer; here both libraries are loaded side by side (each its own copy of the
observer's globals) and each round runs the unprofiled loop and one recording with each library, in a
shuffled order (fixed seed), each recording a fresh start, as a profile's window is. Reports the
median added time per op of each and new - old. Build the other library from a worktree of the other
revision, e.g.

    git worktree add /tmp/old <rev> && cp src/polyprof/_native/_speedups*.so /tmp/old/src/polyprof/_native/
    PYTHONPATH=/tmp/old/src .venv/bin/python -c \\
        "import torch; from polyprof.torch.observer import builder; print(builder.build(torch))"

The libraries must speak this checkout's observer ABI. Only the observer's callbacks are compared:
polyprof.profiler's own start and stop are not in the timed loop.

`--floors` adds observer_floor.py's minimal observers to each round (`empty`, `clock`, and `inputs`: the
clock observer asking for the inputs, as record_shapes does), so that both builds' distance above what
any observer pays is measured in the same process; `--workload neg` times 4,000 `x.neg()` instead of the
MLP (one tensor input an op, little code between the callbacks).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: _common

from _common import mlp_inference, report  # noqa: E402
from observer_floor import minimal_observers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="path of the old build's polyprof_torch_observer.so")
    ap.add_argument("new", help="path of the new build's polyprof_torch_observer.so")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--record-shapes", action="store_true", help="record with RECORD_SHAPES")
    ap.add_argument("--floors", action="store_true", help="also time observer_floor.py's minimal observers")
    ap.add_argument("--workload", choices=("mlp", "neg"), default="mlp")
    args = ap.parse_args()
    import torch

    from polyprof.torch.observer import RECORD_SHAPES, Observer

    options = RECORD_SHAPES if args.record_shapes else 0
    observers = {"old": Observer(args.old), "new": Observer(args.new)}
    work = mlp_inference(20) if args.workload == "mlp" else negations(torch, 4_000)
    work()

    @contextlib.contextmanager
    def recording(observer: Observer):
        observer.start(options)
        try:
            yield
        finally:
            ops[observer.path] = observer.stop()
            observer.reset()

    ops: dict[str, int] = {}
    ways: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "old": lambda: recording(observers["old"]),
        "new": lambda: recording(observers["new"]),
    }
    if args.floors:
        ways.update(minimal_observers())
    rng = random.Random(0)
    times: dict[str, list[int]] = {k: [] for k in ways}
    for _ in range(args.rounds):
        order = list(ways)
        rng.shuffle(order)
        for which in order:
            with ways[which]():
                t0 = time.perf_counter_ns()
                work()
                times[which].append(time.perf_counter_ns() - t0)
    n = ops[args.new]
    plain = statistics.median(times["plain"])
    added = {k: round((statistics.median(v) - plain) / n, 1) for k, v in times.items() if k != "plain"}
    report(
        "observer_builds",
        {
            "torch_version": torch.__version__,
            "record_shapes": args.record_shapes,
            "workload": args.workload,
            "rounds": args.rounds,
            "ops_per_loop": n,
            "plain_ns_per_op": round(plain / n, 1),
            "added_ns_per_op": added,
            "new_minus_old_ns": round(added["new"] - added["old"], 1),
        },
    )


def negations(torch, count: int) -> Callable[[], None]:
    """`count` x.neg() of an 8x64 tensor: one aten op each."""
    x = torch.randn(8, 64)

    def work() -> None:
        for _ in range(count):
            x.neg()

    return work


if __name__ == "__main__":
    main()
