"""``import polyprof`` and one ``record_function`` without profiling, as a library that only annotates
does: wall time (over a bare interpreter start) and the modules it loads.

    .venv/bin/python benchmarks/import_time.py [--runs 15]

Each run is a fresh interpreter; the figure is the median over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from _common import report

CODE = """
import time, sys
t0 = time.perf_counter()
import polyprof
with polyprof.record_function("x"):
    pass
took = time.perf_counter() - t0
mods = sorted(sys.modules)
import json
print(json.dumps({"ms": took * 1e3, "modules": len(mods),
                  "numpy": any(m == "numpy" for m in mods),
                  "polyprof": sorted(m for m in mods if m.split(".")[0] == "polyprof")}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    runs = [json.loads(subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout)
            for _ in range(args.runs)]
    report(
        "import_time",
        {
            "import_and_record_function_ms": round(statistics.median(r["ms"] for r in runs), 2),
            "modules_loaded": runs[0]["modules"],
            "imports_numpy": runs[0]["numpy"],
            "polyprof_modules": runs[0]["polyprof"],
        },
    )


if __name__ == "__main__":
    main()
