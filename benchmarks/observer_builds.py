"""Two builds of polyprof's torch observer library against each other, in one process, per aten op of
the MLP of torch_overhead.py (`_common.mlp_inference`):

    .venv/bin/python benchmarks/observer_builds.py OLD.so NEW.so [--rounds 80] [--record-shapes]

On a shared VM the added time per op moves by +-100 ns from one process to the next, more than most
changes to the observer; here both libraries are loaded side by side (each its own copy of the
observer's globals) and each round runs the unprofiled loop and one recording with each library, in a
shuffled order (fixed seed), each recording a fresh start, as a profile's window is. Reports the
median added time per op of each and new - old. Build the other library from a worktree of the other
revision, e.g.

    git worktree add /tmp/old <rev> && cp src/polyprof/_speedups*.so /tmp/old/src/polyprof/
    PYTHONPATH=/tmp/old/src .venv/bin/python -c \\
        "import torch; from polyprof.backends.torch.observer import builder; print(builder.build(torch))"

The libraries must speak this checkout's observer ABI. Only the observer's callbacks are compared:
polyprof.profiler's own start and stop are not in the timed loop.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _common import mlp_inference, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="path of the old build's polyprof_torch_observer.so")
    ap.add_argument("new", help="path of the new build's polyprof_torch_observer.so")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--record-shapes", action="store_true", help="record with RECORD_SHAPES")
    args = ap.parse_args()
    import torch

    from polyprof.backends.torch.observer import RECORD_SHAPES, Observer

    options = RECORD_SHAPES if args.record_shapes else 0
    observers = {"old": Observer(args.old), "new": Observer(args.new)}
    work = mlp_inference(20)
    work()
    rng = random.Random(0)
    times: dict[str, list[int]] = {"plain": [], "old": [], "new": []}
    ops: dict[str, int] = {}
    for _ in range(args.rounds):
        order = list(times)
        rng.shuffle(order)
        for which in order:
            observer = observers.get(which)
            if observer is not None:
                observer.start(options)
            t0 = time.perf_counter_ns()
            work()
            times[which].append(time.perf_counter_ns() - t0)
            if observer is not None:
                ops[which] = observer.stop()
                observer.reset()
    plain = statistics.median(times["plain"])
    added = {k: round((statistics.median(times[k]) - plain) / ops[k], 1) for k in ("old", "new")}
    report(
        "observer_builds",
        {
            "torch_version": torch.__version__,
            "record_shapes": args.record_shapes,
            "rounds": args.rounds,
            "ops_per_loop": ops["new"],
            "plain_ns_per_op": round(plain / ops["new"], 1),
            "added_ns_per_op": added,
            "new_minus_old_ns": round(added["new"] - added["old"], 1),
        },
    )


if __name__ == "__main__":
    main()
