"""The cost of polyprof's on-demand .pth hook at interpreter start: ``python -c pass`` with and without it.

    .venv/bin/python benchmarks/ondemand_hook.py [--runs 200]

Two fresh virtual environments of the same interpreter, both with polyprof importable (a path file,
as an installed polyprof is), one of them with polyprof's ``polyprof-startup.pth`` too. Each runs ``python -c pass`` `--runs` times, interleaved; reported: the median start-up of each,
the difference, and the start-up with ``POLYPROF_ON_DEMAND=1`` (the process then listens). Also the
hook's own line, timed in-process with the variable unset.
"""

from __future__ import annotations

import argparse
import os
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


def _venv(folder: str, with_hook: bool) -> str:
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", folder], check=True)  # type: ignore[attr-defined]
    python = os.path.join(folder, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    with open(os.path.join(site, "_polyprof-src.pth"), "w") as f:  # polyprof and its dependencies, in both
        f.write(SRC + "\n" + sysconfig.get_paths()["purelib"] + "\n")
    if with_hook:
        with open(os.path.join(site, "polyprof-startup.pth"), "w") as f:
            f.write(open(PTH).read())
    return python


def _start_ms(python: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True, env=env)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "POLYPROF_ON_DEMAND"}
    with tempfile.TemporaryDirectory() as folder:
        bare, hooked = _venv(os.path.join(folder, "bare"), False), _venv(os.path.join(folder, "hooked"), True)
        runtime = os.path.join(folder, "run")
        os.mkdir(runtime, 0o700)
        listening = {**env, "POLYPROF_ON_DEMAND": "1", "XDG_RUNTIME_DIR": runtime}
        for python in (bare, hooked):
            _start_ms(python, env)  # warm the page cache
        times: dict[str, list[float]] = {"bare": [], "hook, variable unset": [], "hook, POLYPROF_ON_DEMAND=1": []}
        for _ in range(args.runs):
            times["bare"].append(_start_ms(bare, env))
            times["hook, variable unset"].append(_start_ms(hooked, env))
        for _ in range(max(10, args.runs // 10)):
            times["hook, POLYPROF_ON_DEMAND=1"].append(_start_ms(hooked, listening))
    line = open(PTH).read().strip()
    os.environ.pop("POLYPROF_ON_DEMAND", None)
    n = 200_000
    line_ns = timeit.timeit(line, number=n) / n * 1e9
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    spread = {k: round(statistics.stdev(v), 2) for k, v in times.items()}
    report("ondemand_hook", {
        "runs": args.runs,
        "python_c_pass_median_ms": medians,
        "stdev_ms": spread,
        "hook_unset_minus_bare_ms": round(medians["hook, variable unset"] - medians["bare"], 3),
        "hook_line_in_process_ns": round(line_ns, 1),
        "listening_minus_bare_ms": round(medians["hook, POLYPROF_ON_DEMAND=1"] - medians["bare"], 2),
    })  # fmt: skip


if __name__ == "__main__":
    main()
