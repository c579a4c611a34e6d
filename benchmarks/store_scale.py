"""The store's scaling law: `polyprof store` and `polyprof summary job.polyprof` as the ranks grow, against
`polyprof summary` of the same traces loaded in memory and, at the smallest size, HTA 0.5 loading them
and running its temporal and kernel breakdowns.

    .venv/bin/python benchmarks/store_scale.py                       # 8 and 64 ranks of 150 k events, 1,024 of 20 k
    .venv/bin/python benchmarks/store_scale.py --sizes 8:150000 --hta --engine spark

Each rank is a synthetic data-parallel rank of ``job_traces.py`` (150 k events asked for: about 112 k
activities and 1.5 k collectives; 20 k: 15 k and 200), written as ``.pftrace`` (HTA's as JSON). At
1,024 ranks each has 20 k events so that the job fits this machine's disk and a few minutes. Every
command runs in a fresh process; a summary's peak RSS is its own high-water mark; the store's, whose
conversion runs in worker processes, is the peak PSS of the process tree (sampled every 20 ms). One run each. ``--engine spark`` also runs the summary on
Spark in local mode (peak: the PSS of the process tree, the JVM in it) and says which analyses, if any,
differ from DuckDB's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from _common import report, run_polyprof_measured, scratch_folder
from job_traces import job_trace
from store_vs_hta import CONSUMERS, measured

from polyprof.formats import write_trace

HTA_TEMPORAL_KERNELS = (
    "import sys, logging, warnings\nwarnings.simplefilter('ignore'); logging.disable(logging.CRITICAL)\n"
    "from hta.trace_analysis import TraceAnalysis\na = TraceAnalysis(trace_dir=sys.argv[1])\n"
    "print('temporal', len(a.get_temporal_breakdown(visualize=False)))\n"
    "print('kernels', len(a.get_gpu_kernel_breakdown(visualize=False)[1]))\n"
)
#: every analysis of the store on Spark and on DuckDB, compared row for row (sorted: a view's order is its own)
SPARK_EQUALS_DUCKDB = """
import sys
from polyprof import store
from polyprof.store.query import ANALYSES
spark = store.open(sys.argv[1], "spark")
duck = store.open(sys.argv[1])
differ = [name for name in ANALYSES if sorted(map(repr, spark.analysis(name).to_pylist()))
          != sorted(map(repr, duck.analysis(name).to_pylist()))]
print("DIFFER", ",".join(differ) or "none")
"""


def _sizes(text: list[str]) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (s.split(":") for s in text)]


def one_size(folder: str, ranks: int, events: int, in_memory: bool, hta: bool, engine: str | None) -> dict:
    traces = os.path.join(folder, f"ranks{ranks}")
    os.makedirs(traces)
    for rank in range(ranks):
        write_trace(job_trace(rank, ranks, events), os.path.join(traces, f"rank{rank}.pftrace"))
    store = os.path.join(folder, f"job{ranks}.polyprof")
    found: dict = {"ranks": ranks, "events_per_rank": events}
    made = measured([sys.executable, "-m", "polyprof", "store", "--quiet", traces, "-o", store])
    found["store"] = {"seconds": made["seconds"], "peak_pss_mb_of_the_process_tree": round(made["peak_pss_mb"])}
    seconds, peak, _ = run_polyprof_measured(["summary", "--quiet", store])
    found["summary_of_store"] = {"seconds": round(seconds, 1), "peak_rss_mb": round(peak / 1e6),
                                 "per_rank_ms": round(seconds * 1e3 / ranks, 1)}
    if engine == "spark":
        result = measured([sys.executable, "-m", "polyprof", "summary", "--quiet", store, "--engine", "spark"])
        check = subprocess.run([sys.executable, "-c", SPARK_EQUALS_DUCKDB, store], capture_output=True, text=True)
        differ = [line.split()[1] for line in check.stdout.splitlines() if line.startswith("DIFFER")]
        found["summary_on_spark"] = {"seconds": result["seconds"], "peak_pss_mb": round(result["peak_pss_mb"]),
                                     "analyses_differing_from_duckdb": differ[-1] if differ else check.stderr[-300:]}
    if in_memory:
        seconds, peak, _ = run_polyprof_measured(["summary", "--quiet", traces])
        found["summary_in_memory"] = {"seconds": round(seconds, 1), "peak_rss_mb": round(peak / 1e6)}
        found["time_ratio"] = round(found["summary_of_store"]["seconds"] / seconds, 2)
    if hta and os.path.exists(CONSUMERS):
        as_json = os.path.join(folder, f"json{ranks}")
        os.makedirs(as_json)
        for rank in range(ranks):
            write_trace(job_trace(rank, ranks, events), os.path.join(as_json, f"rank{rank}.json"))
        result = measured([CONSUMERS, "-c", HTA_TEMPORAL_KERNELS, as_json])
        found["hta_load_temporal_kernels"] = {"seconds": result["seconds"], "peak_pss_mb": round(result["peak_pss_mb"])}
        shutil.rmtree(as_json)
    shutil.rmtree(traces)
    shutil.rmtree(store)
    print(found, file=sys.stderr)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["8:150000", "64:150000", "1024:20000"], help="RANKS:EVENTS each")
    ap.add_argument("--in-memory-up-to", type=int, default=64, help="the in-memory summary up to this many ranks")
    ap.add_argument("--hta", action="store_true", help="HTA 0.5 at the smallest size (from .venv-consumers)")
    ap.add_argument("--engine", choices=["duckdb", "spark"], default="duckdb")
    args = ap.parse_args()
    sizes = _sizes(args.sizes)
    folder = scratch_folder()
    rows = [one_size(folder, ranks, events, ranks <= args.in_memory_up_to, args.hta and i == 0, args.engine)
            for i, (ranks, events) in enumerate(sizes)]
    report("store_scale", {"sizes": rows})


if __name__ == "__main__":
    main()
