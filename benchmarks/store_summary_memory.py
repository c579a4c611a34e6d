"""`polyprof summary job.polyprof` under DuckDB's memory limit (polyprof's default, 512 MB) and under
DuckDB's own default (80% of RAM), against `polyprof summary` of the same traces loaded in memory.

    .venv/bin/python benchmarks/store_summary_memory.py [--ranks 8 32] [--events 150000]

Each rank is a synthetic data-parallel rank of ``job_traces.py`` (``--events`` rows asked for, about 112 k
activities and 1.5 k collectives made), written as ``.pftrace``; the store is made by ``polyprof store``.
Each summary runs in a fresh process, its peak RSS its own high-water mark. One run each.
"""

from __future__ import annotations

import argparse
import os

from _common import report, run_polyprof_measured, scratch_folder
from job_traces import job_trace

from polyprof.formats import write_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--events", type=int, default=150_000)
    args = ap.parse_args()
    folder = scratch_folder()
    found = {}
    for world in args.ranks:
        traces = os.path.join(folder, f"ranks{world}")
        os.makedirs(traces)
        for rank in range(world):
            write_trace(job_trace(rank, world, args.events), os.path.join(traces, f"rank{rank}.pftrace"))
        store = os.path.join(folder, f"job{world}.polyprof")
        run_polyprof_measured(["store", "--quiet", traces, "-o", store])
        cases = {"store, 512MB (default)": ["summary", store], "store, DuckDB's default": ["summary", store, "--memory-limit", "none"],
                 "traces in memory": ["summary", "--quiet", traces]}  # fmt: skip
        found[f"{world} ranks"] = {}
        for case, cmd in cases.items():
            seconds, peak, _ = run_polyprof_measured(cmd)
            found[f"{world} ranks"][case] = {"seconds": round(seconds, 1), "peak_rss_mb": round(peak / 1e6)}
    report("store_summary_memory", {"events_per_rank": args.events, **found})


if __name__ == "__main__":
    main()
