"""What any RecordFunction observer pays, against polyprof's observer and torch.profiler, per aten op of
the 20-layer MLP of torch_overhead.py (`_common.mlp_inference`), in one process:

    .venv/bin/python benchmarks/probes/observer_floor.py [--rounds 41] [--record-shapes]

Besides the unprofiled loop, five ways of observing it: two minimal observers built here (with
torch.utils.cpp_extension; needs a C++ compiler and ninja): `empty` (callbacks that return at once)
and `clock` (callbacks that read CLOCK_MONOTONIC and a few of the op's fields, the least a profiler
records); `inputs` (the clock observer asking for the op's inputs, as record_shapes does: torch then
boxes every argument); polyprof.profiler; torch.profiler. Each round runs every way once, in a shuffled
order (fixed seed), each on a warm profile (one loop before the timed one). Reports the median added
time per op of each, and polyprof's and the floors' ratios to torch.profiler's: what a profiler can
still win is its distance above `clock` (`inputs` with record_shapes).
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

from _common import mlp_inference, report, scratch_folder  # noqa: E402

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <time.h>

namespace {
at::CallbackHandle handle = 0;
thread_local int64_t sink = 0;

int64_t now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
std::unique_ptr<at::ObserverContext> start_empty(const at::RecordFunction&) { return nullptr; }
void end_empty(const at::RecordFunction&, at::ObserverContext*) {}
std::unique_ptr<at::ObserverContext> start_clock(const at::RecordFunction& fn) {
  sink += now() + int64_t(reinterpret_cast<intptr_t>(fn.name())) + fn.seqNr() + int64_t(fn.handle());
  return nullptr;
}
void end_clock(const at::RecordFunction&, at::ObserverContext*) { sink += now(); }
}  // namespace

// 0: remove; 1: empty; 2: clock; 3: clock, asking for the inputs
void install(int mode) {
  if (handle != 0) at::removeCallback(handle);
  handle = 0;
  if (mode == 1) handle = at::addThreadLocalCallback(at::RecordFunctionCallback(start_empty, end_empty));
  if (mode >= 2) {
    handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(start_clock, end_clock).needsInputs(mode == 3));
  }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--record-shapes", action="store_true")
    args = ap.parse_args()
    import torch

    import polyprof.profiler as pp

    floors = minimal_observers()
    work = mlp_inference()
    shapes = args.record_shapes
    ways = {
        "plain": contextlib.nullcontext,
        "empty": floors["empty"],
        "clock": floors["inputs" if shapes else "clock"],
        "polyprof": lambda: pp.profile(activities=[pp.ProfilerActivity.CPU], record_shapes=shapes),
        "torch": lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes
        ),
    }
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as counted:
        work()
    ops = sum(1 for e in counted.events() if e.device_type == torch.autograd.DeviceType.CPU)
    samples: dict[str, list[int]] = {k: [] for k in ways}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(ways)
        rng.shuffle(order)
        for way in order:
            with ways[way]():
                work()  # warm: the timed loop is not a profile's first
                t0 = time.perf_counter_ns()
                work()
                samples[way].append(time.perf_counter_ns() - t0)
    plain = statistics.median(samples["plain"]) / ops
    added = {k: round(statistics.median(v) / ops - plain, 1) for k, v in samples.items() if k != "plain"}
    report(
        "observer_floor",
        {
            "torch_version": torch.__version__,
            "record_shapes": shapes,
            "rounds": args.rounds,
            "ops_per_loop": ops,
            "plain_ns_per_op": round(plain, 1),
            "added_ns_per_op": added,
            "clock_is": "clock callbacks asking for the inputs" if shapes else "clock callbacks",
            "ratio_over_torch": {k: round(v / added["torch"], 3) for k, v in added.items() if k != "torch"},
        },
    )


def minimal_observers() -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """The minimal observers, built here with torch.utils.cpp_extension, each as a context manager that
    installs it: `empty`, `clock`, and `inputs` (the clock observer asking for the op's inputs)."""
    from torch.utils.cpp_extension import load_inline

    floor = load_inline(
        "polyprof_observer_floor", SOURCE, functions=["install"], extra_cflags=["-O2"],
        build_directory=scratch_folder("observer-floor-"),
    )

    @contextlib.contextmanager
    def minimal(mode: int):
        floor.install(mode)
        try:
            yield
        finally:
            floor.install(0)

    return {"empty": lambda: minimal(1), "clock": lambda: minimal(2), "inputs": lambda: minimal(3)}


if __name__ == "__main__":
    main()
