"""The flight recorder's cost on a training loop: a 4-layer GPT-style transformer (CPU, AdamW; the
model of ``with_stack_training.py``) trained with no recorder, with the flight recorder (defaults:
top-level ops; and with ``ops="none"``) and under torch.profiler (CPU activities, its defaults), in
interleaved rounds in one process; then a 30 s ring filled by training, captured: its write time (off
the training thread), the memory the ring holds and how long the recorder's stop takes.

    .venv/bin/python benchmarks/flight_recorder.py [--rounds 21] [--steps 8] [--ring-s 30]

Each round runs plain steps, then each variant (started before its steps, stopped after them) and
plain steps again; a variant's added time is its step time against the mean of the plain runs just
before and after it, so that the machine's drift cancels. Targets (issue #54): the defaults add at most
1% to the step, at most 0.2% with operators off; a 30 s capture is written in at most 1 s and the ring
holds at most 256 MB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import report, scratch_folder
from with_stack_training import training_step


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--ring-s", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import polyprof
    from polyprof.flight import FlightRecorder

    step = training_step(torch)
    folder = scratch_folder()

    def steps(n: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            step()
        return (time.perf_counter_ns() - t0) / n

    def variant(name: str):
        if name == "torch.profiler":
            return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        ops = "top" if name == "flight (defaults)" else "none"
        return FlightRecorder(args.ring_s, out_dir=folder, ops=ops, signals=(), hang_s=None)

    names = ["flight (defaults)", "flight (ops off)", "torch.profiler"]
    steps(4)  # warm up
    added: dict[str, list[float]] = {n: [] for n in names}
    plain: list[float] = []
    for r in range(args.rounds):
        before = steps(args.steps)
        plain.append(before)
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            running = variant(name)
            running.__enter__()
            steps(1)  # the first step after a start pays its one-time costs
            took = steps(args.steps)
            running.__exit__(None, None, None)
            after = steps(args.steps)
            plain.append(after)
            added[name].append(took - (before + after) / 2)
            before = after
    step_ns = statistics.median(plain)
    added_med = {n: statistics.median(v) for n, v in added.items()}

    # a full ring, captured
    rss0 = rss_mb()
    recorder = polyprof.flight_recorder(args.ring_s, out_dir=folder, signals=(), hang_s=None)
    deadline = time.monotonic() + args.ring_s * 1.2
    n = 0
    while time.monotonic() < deadline:
        step()
        n += 1
    rss_full = rss_mb()
    t0 = time.perf_counter()
    recorder.capture("benchmark")
    recorder.wait(120)
    trigger_to_file = time.perf_counter() - t0
    trace = polyprof.load_trace(recorder.captures[0])
    t0 = time.perf_counter()
    recorder.stop()  # the ring is let go, unmerged: the captures are the output
    stop_s = time.perf_counter() - t0
    report(
        "the flight recorder on a training loop (4-layer GPT, AdamW, CPU)",
        {
            "step_ms": round(step_ns / 1e6, 2),
            "added_ms": {n: round(v / 1e6, 3) for n, v in added_med.items()},
            "added_share": {n: round(v / step_ns, 4) for n, v in added_med.items()},
            "ratio_defaults_over_torch_profiler": round(added_med["flight (defaults)"] / added_med["torch.profiler"], 3),
            "every_round_added_ms": {n: [round(x / 1e6, 2) for x in v] for n, v in added.items()},
            "ring": {"seconds": args.ring_s, "steps_run": n, "rss_growth_mb": round(rss_full - rss0, 1),
                     "capture_write_s": round(recorder.write_seconds[0], 3), "trigger_to_file_s": round(trigger_to_file, 3),
                     "capture_mb": round(os.path.getsize(recorder.captures[0]) / 1e6, 2),
                     "capture_rows": len(trace.activities), "stop_s": round(stop_s, 3)},
        },
    )


if __name__ == "__main__":
    main()
