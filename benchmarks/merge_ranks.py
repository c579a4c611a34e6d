"""`polyprof merge` of several synthetic ranks: events/s and peak memory.

    .venv/bin/python benchmarks/merge_ranks.py [--ranks 8] [--events 1000000] [--format json|pftrace]
        [--to json|pftrace]    (the merged file's format; the inputs' by default)

Writes `--ranks` polyprof traces of `--events` activities each (the synthetic trace of
export_throughput.py, with distributedInfo and a recorded clock offset per rank), then runs
`python -m polyprof merge` on them in a child process and reports wall time, events/s and the child's
peak RSS against the largest input. Targets (issue #16): at least 2 M events/s; peak RSS at most 2x
the largest single input.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from _common import report, run_polyprof_measured
from export_throughput import synthetic_trace

from polyprof.formats import write_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--format", choices=["json", "pftrace"], default="json")
    ap.add_argument("--to", choices=["json", "pftrace"], default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for r in range(args.ranks):
            trace = synthetic_trace(args.events, seed=r)
            trace.metadata["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": args.ranks}
            next(iter(trace.backends.values())).clock["to rank 0"] = {"offset_ns": 1000 * r, "uncertainty_ns": 50}
            paths.append(write_trace(trace, os.path.join(folder, f"rank{r}.{args.format}")))
            del trace
        out = os.path.join(folder, f"merged.{args.to or args.format}")
        seconds, peak, _ = run_polyprof_measured(["merge", *paths, "-o", out])
        largest = max(os.path.getsize(p) for p in paths)
        events = args.ranks * args.events
        report(
            "merge_ranks",
            {
                "ranks": args.ranks,
                "events_per_rank": args.events,
                "format": args.format,
                "to": args.to or args.format,
                "seconds": round(seconds, 1),
                "events_per_s": round(events / seconds),
                "largest_input_bytes": largest,
                "peak_rss_bytes": peak,
                "peak_rss_over_largest_input": round(peak / largest, 2),
                "targets": {"events_per_s_min": 2_000_000, "peak_rss_over_largest_input_max": 2.0},
                "meets_targets": events / seconds >= 2_000_000 and peak <= 2 * largest,
            },
        )


if __name__ == "__main__":
    main()
