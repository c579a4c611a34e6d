"""A job's analyses at scale: polyprof's store (``polyprof store``, then the kernel, temporal, idle and
overlap analyses on DuckDB) against Holistic Trace Analysis 0.5 (``TraceAnalysis`` on the same folder,
then the same four analyses for every rank), each in a fresh process tree: wall time, and the peak of
the whole tree's memory (HTA's parsing workers and polyprof's conversion workers counted), sampled every
20 ms with psutil as PSS: forked workers share their parent's pages, which RSS would count once per
process.

    .venv/bin/python benchmarks/store_vs_hta.py [--ranks 64] [--events 20000] [--hta-timeout 600]
    .venv/bin/python benchmarks/store_vs_hta.py --scale 64,256,1024 --events 20000   # the store only

``--scale`` writes each size's store straight from the synthetic traces (no JSON) and times the four
analyses on DuckDB with a memory limit (``--memory-limit``, 1 GB), to show how time and memory grow with
the ranks.
HTA runs from ``.venv-consumers`` (scripts/setup.sh --test makes it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import psutil
from _common import report, scratch_folder
from job_traces import job_trace

from polyprof.formats import write_trace

CONSUMERS = os.path.join(os.path.dirname(__file__), "..", ".venv-consumers", "bin", "python")
ANALYSES = ("kernels", "temporal", "idle", "overlap")
POLYPROF_ANALYSES = (
    "import sys, time\nfrom polyprof import store\njob = store.open(sys.argv[1], store.engines.DuckDBEngine(sys.argv[2] or None))\n"
    f"for name in {ANALYSES!r}:\n    rows = job.analysis(name).num_rows\n    print(name, rows)\n"
)
HTA = (
    "import sys, logging, warnings\nwarnings.simplefilter('ignore'); logging.disable(logging.CRITICAL)\n"
    "from hta.trace_analysis import TraceAnalysis\na = TraceAnalysis(trace_dir=sys.argv[1])\nranks = sorted(a.t.traces)\n"
    "print('kernels', len(a.get_gpu_kernel_breakdown(visualize=False)[1]))\n"
    "print('temporal', len(a.get_temporal_breakdown(visualize=False)))\n"
    "print('idle', len(a.get_idle_time_breakdown(ranks=ranks, visualize=False)[0]))\n"
    "print('overlap', len(a.get_comm_comp_overlap(visualize=False)))\n"
)


def measured(cmd: list[str], timeout_s: float | None = None) -> dict:
    """Run `cmd`; its wall time and the peak memory of its process tree (after `timeout_s`, the tree is
    killed and the result says it did not finish)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                total = sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                total = 0
            peak = max(peak, total)
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.communicate()
        done.set()
        sampler.join()
        return {"seconds": round(time.perf_counter() - start, 2), "peak_pss_mb": round(peak / 2**20, 1),
                "finished": False}
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed:\n{err[-3000:]}")
    return {"seconds": round(seconds, 2), "peak_pss_mb": round(peak / 2**20, 1), "output": out.split()}


def compare(ranks: int, events: int, hta_timeout_s: float | None = None) -> dict:
    folder = scratch_folder()
    traces = os.path.join(folder, "traces")
    os.makedirs(traces)
    for r in range(ranks):
        write_trace(job_trace(r, ranks, events), os.path.join(traces, f"rank{r}.json"))
    size = sum(os.path.getsize(os.path.join(traces, f)) for f in os.listdir(traces))
    job = os.path.join(folder, "job.polyprof")
    made = measured([sys.executable, "-m", "polyprof", "store", traces, "-o", job, "-q"])
    analysed = measured([sys.executable, "-c", POLYPROF_ANALYSES, job, ""])
    polyprof_s = made["seconds"] + analysed["seconds"]
    polyprof_mb = max(made["peak_pss_mb"], analysed["peak_pss_mb"])
    out = {"ranks": ranks, "events_per_rank": events, "json_mb": round(size / 2**20, 1),
           "polyprof": {"store": made, "analyses": analysed, "seconds": round(polyprof_s, 2), "peak_pss_mb": polyprof_mb}}
    if os.path.exists(CONSUMERS):
        hta = measured([CONSUMERS, "-c", HTA, traces], hta_timeout_s)
        out["hta"] = hta
        out["time_ratio"] = round(polyprof_s / hta["seconds"], 3)
        out["memory_ratio"] = round(polyprof_mb / hta["peak_pss_mb"], 3)
    return out


def scale(sizes: list[int], events: int, memory_limit: str = "1GB") -> list[dict]:
    from polyprof.formats.store.files import StoreStats, write_manifest, write_rank
    from polyprof.formats.store.rank_tables import rank_tables

    rows = []
    for ranks in sizes:
        folder = os.path.join(scratch_folder(), "job.polyprof")
        stats = StoreStats(folder)
        for r in range(ranks):
            tables = rank_tables(job_trace(r, ranks, events), fallback_rank=r)
            stats.rows = {k: stats.rows.get(k, 0) + v for k, v in write_rank(tables, folder).items()}
            stats.sources[r] = f"rank{r}"
        stats.ranks = sorted(stats.sources)
        write_manifest(folder, stats)
        result = measured([sys.executable, "-c", POLYPROF_ANALYSES, folder, memory_limit])
        rows.append({"ranks": ranks, "activities": stats.rows["activities"], "memory_limit": memory_limit,
                     **{k: result[k] for k in ("seconds", "peak_pss_mb")}})
        print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--scale", default=None, help="comma-separated rank counts: the store's analyses only")
    parser.add_argument("--hta-timeout", type=float, default=None, help="stop HTA after this many seconds")
    parser.add_argument("--memory-limit", default="1GB", help="DuckDB's memory limit for --scale")
    args = parser.parse_args()
    if args.scale:
        report("store_scale", {"rows": scale([int(x) for x in args.scale.split(",")], args.events, args.memory_limit)})
    else:
        report("store_vs_hta", compare(args.ranks, args.events, args.hta_timeout))


if __name__ == "__main__":
    main()
