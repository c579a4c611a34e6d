"""Instructions per record_function enter+exit, counted by valgrind (callgrind): repeatable where wall
time is not (a shared VM), and available where the CPU's counters are not (perf stat says "not
supported" in this project's VMs).

    .venv/bin/python benchmarks/instruction_counts.py [--n 100000] [--torch] [--ops]

Each case runs in a child Python under ``valgrind --tool=callgrind`` twice, with N and 2N iterations;
the difference of the two totals over N is the cost of one iteration (interpreter start, imports and
the profile's start and stop cancel out; the hash seed is fixed so that they are the same). Only the
main thread's instructions count, and a clock read is a system call under valgrind, so the kernel's
side of it (the vDSO's, natively) is not in the figures. Cases: an empty loop, a bare ``with lock:``, a plain function
call, ``polyprof.record_function`` not profiling and while profiling (context manager and decorator),
``polyprof.instant`` while profiling, and with ``--torch`` torch.profiler's ``record_function`` while
profiling (slow under valgrind: torch's import). ``--ops`` counts an aten operator instead (``x.neg()``,
N of them: torch's start differs by ~1 M instructions from one run to the next, so N must be large): unprofiled, under polyprof.profiler's observer and under torch.profiler's, and the
instructions each adds per operator.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from _common import report

CASES = {
    "empty_loop": ("", "pass"),
    "bare_with_lock": ("import threading; lock = threading.Lock()", "with lock: pass"),
    "plain_call": ("def f(): pass", "f()"),
    "record_function_not_profiling": ("rf = polyprof.record_function", "with rf('x'): pass"),
    "record_function_profiling": ("rf = polyprof.record_function; p = polyprof.profile(['cpu']); p.__enter__()",
                                  "with rf('x'): pass"),
    "decorated_call_profiling": ("f = polyprof.record_function('x')(lambda: None); p = polyprof.profile(['cpu']); "
                                 "p.__enter__()", "f()"),
    "instant_profiling": ("p = polyprof.profile(['cpu']); p.__enter__(); instant = polyprof.instant", "instant('x')"),
}
TORCH_CASE = (
    "import torch; from torch.profiler import profile, record_function as rf, ProfilerActivity; "
    "p = profile(activities=[ProfilerActivity.CPU]); p.__enter__()",
    "with rf('x'): pass",
)
OP_CASES = {  # an aten operator (x.neg() on 4 floats), unprofiled and under each profiler's observer
    "aten_op_unprofiled": ("import torch; x = torch.ones(4)", "x.neg()"),
    "aten_op_polyprof": ("import torch, polyprof.profiler as pp; x = torch.ones(4); "
                         "p = pp.profile(activities=[pp.ProfilerActivity.CPU]); p.__enter__()", "x.neg()"),
    "aten_op_torch": ("import torch; from torch.profiler import profile, ProfilerActivity; x = torch.ones(4); "
                      "p = profile(activities=[ProfilerActivity.CPU]); p.__enter__()", "x.neg()"),
}

#: Leaving at once after the loop: the profiles' stop is not counted (and torch's at exit crashes under
#: valgrind).
QUIT_NOW = "import os; os._exit(0)\n"

SCRIPT = """
import polyprof
{setup}
def run(n):
    for _ in range(n):
        {body}
run({n})
{tail}"""


def instructions(setup: str, body: str, n: int, tail: str = "") -> int:
    """The instructions (callgrind's Ir) the main thread of a child Python running `body` n times
    executes (a profile's background threads wake by wall time, which valgrind stretches: not counted)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        r = subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
             sys.executable, "-c", SCRIPT.format(setup=setup, body=body, n=n, tail=tail)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # a fixed hash seed: the same start-up in both runs, so that it cancels out
        with open(out + "-01") as f:
            found = re.search(r"^totals:\s*(\d+)", f.read(), re.M)
        if found is None:
            raise RuntimeError(f"no instruction count in valgrind's output:\n{r.stderr[-2000:]}")
        return int(found.group(1))


def per_iteration(setup: str, body: str, n: int, tail: str = "") -> float:
    return (instructions(setup, body, 2 * n, tail) - instructions(setup, body, n, tail)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--torch", action="store_true", help="also torch.profiler's record_function (slow)")
    ap.add_argument("--ops", action="store_true", help="only an aten operator: unprofiled, polyprof, torch (slow)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (Debian: apt install valgrind)")
    if args.ops:
        return _ops(args.n)
    cases = dict(CASES)
    if args.torch:
        cases["torch_record_function_profiling"] = TORCH_CASE
    results: dict = {"n": args.n, "instructions_per_iteration": {}}
    counts = results["instructions_per_iteration"]
    for name, (setup, body) in cases.items():
        torch_case = "torch" in name  # torch's span is slow: a tenth of the iterations, and QUIT_NOW
        n, tail = (args.n // 10, QUIT_NOW) if torch_case else (args.n, "")
        counts[name] = round(per_iteration(setup, body, n, tail), 1)
    loop = counts["empty_loop"]
    results["record_function_profiling_over_not_profiling"] = round(
        (counts["record_function_profiling"] - loop) / (counts["record_function_not_profiling"] - loop), 3
    )
    if "torch_record_function_profiling" in counts:
        results["ratio_polyprof_over_torch"] = round(
            counts["record_function_profiling"] / counts["torch_record_function_profiling"], 4
        )
    report("instruction_counts", results)


def _ops(n: int) -> None:
    """Instructions an aten operator adds under polyprof's observer and under torch.profiler's."""
    counts = {name: round(per_iteration(setup, body, n, QUIT_NOW), 1) for name, (setup, body) in OP_CASES.items()}
    plain = counts["aten_op_unprofiled"]
    added = {"polyprof": round(counts["aten_op_polyprof"] - plain, 1), "torch": round(counts["aten_op_torch"] - plain, 1)}
    report("instruction_counts", {"n": n, "instructions_per_iteration": counts, "added_per_op": added,
                                  "ratio_added_polyprof_over_torch": round(added["polyprof"] / added["torch"], 3)})


if __name__ == "__main__":
    main()
