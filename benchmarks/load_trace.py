"""Reading a large trace back: ``polyprof.load_trace`` (C scanner, and the reference reader that runs
without the extension) against Holistic Trace Analysis 0.5's parser on the same Kineto JSON file, each
in a fresh process: wall time of the read and the process's peak RSS (VmHWM). The same trace as
``.pftrace`` is read by polyprof both ways too (HTA reads JSON only).

    .venv/bin/python benchmarks/load_trace.py [--events 1000000]

HTA runs from ``.venv-consumers`` (scripts/setup.sh --test makes it), where that exists.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _common import report, scratch_folder
from export_throughput import synthetic_trace

from polyprof.formats import write_trace

PEAK = "print('peak_kb', next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"
POLYPROF = (
    "import sys, time\nfrom polyprof import load_trace\nt = time.perf_counter()\ntrace = load_trace(sys.argv[1])\n"
    "print('seconds', time.perf_counter() - t)\nprint('rows', len(trace.activities))\n" + PEAK
)
HTA = (
    "import sys, time, logging\nlogging.disable(logging.INFO)\n"
    "from hta.common.trace_parser import parse_trace_dataframe\nfrom hta.configs.parser_config import ParserConfig\n"
    "t = time.perf_counter()\nmeta, df, symbols = parse_trace_dataframe(sys.argv[1], ParserConfig())\n"
    "print('seconds', time.perf_counter() - t)\nprint('rows', len(df))\n" + PEAK
)
CONSUMERS = os.path.join(os.path.dirname(__file__), "..", ".venv-consumers", "bin", "python")


def measured(python: str, code: str, path: str, env: dict | None = None) -> dict | None:
    run = subprocess.run([python, "-c", code, path], capture_output=True, text=True, env={**os.environ, **(env or {})})
    if run.returncode != 0:
        print(run.stderr[-2000:], file=sys.stderr)
        return None
    said = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    return {"seconds": round(float(said["seconds"]), 2), "peak_mb": int(said["peak_kb"]) >> 10, "rows": int(said["rows"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    folder = scratch_folder()
    path, pftrace = os.path.join(folder, "trace.json"), os.path.join(folder, "trace.pftrace")
    trace = synthetic_trace(args.events, seed=7)
    write_trace(trace, path)
    write_trace(trace, pftrace)
    del trace
    results: dict = {"events": args.events, "file_mb": os.path.getsize(path) >> 20}
    results["polyprof_c"] = measured(sys.executable, POLYPROF, path)
    results["polyprof_reference_reader"] = measured(sys.executable, POLYPROF, path, {"POLYPROF_PURE_PYTHON": "1"})
    results["pftrace_mb"] = os.path.getsize(pftrace) >> 20
    results["pftrace_polyprof_c"] = measured(sys.executable, POLYPROF, pftrace)
    results["pftrace_reference_reader"] = measured(sys.executable, POLYPROF, pftrace, {"POLYPROF_PURE_PYTHON": "1"})
    results["hta_0_5"] = measured(CONSUMERS, HTA, path) if os.path.exists(CONSUMERS) else "no .venv-consumers"
    hta = results["hta_0_5"]
    if isinstance(hta, dict) and results["polyprof_c"]:
        results["ratio_time_polyprof_c_over_hta"] = round(results["polyprof_c"]["seconds"] / hta["seconds"], 3)
        results["ratio_peak_polyprof_c_over_hta"] = round(results["polyprof_c"]["peak_mb"] / hta["peak_mb"], 3)
    report("load_trace", results)


if __name__ == "__main__":
    main()
