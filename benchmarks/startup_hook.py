"""The cost of polyprof's start-up hook to every Python process: ``python -c pass`` with polyprof not
installed, installed with no variable set, and with each of its variables set.

    .venv/bin/python benchmarks/startup_hook.py [--runs 30]

Two fresh virtual environments of the same interpreter: one where polyprof is not importable, one
where it is (a path file, as an installed polyprof is) with its ``polyprof-startup.pth``. Each case runs
``python -c pass`` `--runs` times, the cases interleaved; reported: each case's median and its
difference from polyprof not installed (target: at most 5 ms with any one variable set). Also the
hook's line, timed in-process with no variable set.
"""

from __future__ import annotations

import argparse
import os
import py_compile
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import timeit

from _common import report

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
PTH = os.path.join(SRC, "polyprof", "polyprof-startup.pth")


def _venv(folder: str, with_polyprof: bool) -> str:
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", folder], check=True)  # type: ignore[attr-defined]
    python = os.path.join(folder, "bin", "python")
    if with_polyprof:
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(site, "_polyprof-src.pth"), "w") as f:  # polyprof and its dependencies
            f.write(SRC + "\n" + sysconfig.get_paths()["purelib"] + "\n")
        with open(os.path.join(site, "polyprof-startup.pth"), "w") as f:
            f.write(open(PTH).read())
    return python


def _start_ms(python: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True, env=env)
    return (time.perf_counter() - t0) * 1000


CASES = {"no variable": {}, "POLYPROF_TORCH_PROFILER=1": {"POLYPROF_TORCH_PROFILER": "1"},
         "POLYPROF_ON_DEMAND=1": {"POLYPROF_ON_DEMAND": "1"}, "POLYPROF_ACTIVITIES=+cpu": {"POLYPROF_ACTIVITIES": "+cpu"},
         "POLYPROF_FLIGHT_RECORDER=30": {"POLYPROF_FLIGHT_RECORDER": "30"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    # compiled, as pip installs it (where PYTHONDONTWRITEBYTECODE is set, nothing would write it)
    py_compile.compile(os.path.join(SRC, "_polyprof_startup.py"), doraise=True)
    with tempfile.TemporaryDirectory() as folder:
        bare, installed = _venv(os.path.join(folder, "bare"), False), _venv(os.path.join(folder, "installed"), True)
        runtime = os.path.join(folder, "run")
        os.mkdir(runtime, 0o700)
        env["XDG_RUNTIME_DIR"] = runtime
        for python in (bare, installed):
            _start_ms(python, env)  # warm the page cache
        times: dict[str, list[float]] = {"not installed": [], **{case: [] for case in CASES}}
        for _ in range(args.runs):
            times["not installed"].append(_start_ms(bare, env))
            for case, variables in CASES.items():
                times[case].append(_start_ms(installed, {**env, **variables}))
    line = open(PTH).read().strip()
    n = 200_000
    line_ns = timeit.timeit(line, number=n, globals={}) / n * 1e9
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    report("startup_hook", {
        "runs": args.runs,
        "python_c_pass_median_ms": medians,
        "stdev_ms": {k: round(statistics.stdev(v), 2) for k, v in times.items()},
        "minus_not_installed_ms": {k: round(v - medians["not installed"], 2) for k, v in medians.items() if k != "not installed"},
        "hook_line_in_process_ns": round(line_ns, 1),
    })


if __name__ == "__main__":
    main()
