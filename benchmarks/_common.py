"""Shared helpers for the benchmarks: machine description, and results printed and written (``report``)."""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def scratch_folder(prefix: str = "polyprof-bench-") -> str:
    """A temporary folder for a benchmark's traces, spills or builds, removed when the process exits
    (31 repeats of torch_overhead.py write ~80 MB of traces).

    A benchmark that times writing a file should also delete it once read: on a VM whose memory the
    host hands over on first touch (this task's Firecracker guests), a file written into pages the
    guest never used costs ~2 us a 4 KiB page (3.2 MB: 7 ms, against 0.7 ms in pages a deleted file
    gave back), which is the hypervisor's cost, not the writer's."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def per_call_ns(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Median over `repeats` batches of the wall time per iteration of fn(n)."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def mlp_inference(passes: int = 20) -> Callable[[], None]:
    """The torch benchmarks' workload: `passes` forward passes (no grad) of a 20-layer MLP of 64-wide
    Linear layers on a batch of 8, ~200 aten ops a pass. Seeded, so every run builds the same one."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(20)])
    x = torch.randn(8, 64)

    def work() -> None:
        with torch.no_grad():
            for _ in range(passes):
                model(x)

    return work


#: where each benchmark's last run is written (``NAME.json``): what a figure in figures.json is read from
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def report(name: str, results: dict) -> None:
    """Print the run's results and write them to ``results/NAME.json`` with the machine, the date and the
    command (``POLYPROF_BENCH_RESULTS`` names another folder; empty: write none)."""
    import sys

    run = {"benchmark": name, "machine": machine(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
           "command": " ".join(["benchmarks/" + os.path.basename(sys.argv[0]), *sys.argv[1:]]), **results}
    text = json.dumps(run, indent=2, default=str)
    print(text)
    folder = os.environ.get("POLYPROF_BENCH_RESULTS", RESULTS)
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
            f.write(text + "\n")


_MEASURED = """
import atexit, sys
def _peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                print("POLYPROF_BENCH_PEAK_KB", line.split()[1], file=sys.stderr, flush=True)
atexit.register(_peak)
sys.argv = ["polyprof", *sys.argv[1:]]
"""


def run_polyprof_measured(args: list[str]) -> tuple[float, int, str]:
    """Run `polyprof ARGS` in a child process; (wall seconds, its peak RSS in bytes, its stderr). The
    peak is the child's own high-water mark (/proc/self/status VmHWM), not getrusage's, which counts
    the RSS the child inherited from this process at fork."""
    return run_python_measured(_MEASURED + "from polyprof.cli.main import main\nmain()\n", args)


def run_python_measured(code: str, args: list[str]) -> tuple[float, int, str]:
    """Run Python `code` with `args` as sys.argv[1:] in a child process, measured as
    :func:`run_polyprof_measured` measures (its code sees ``sys.argv[0] == "polyprof"``)."""
    import subprocess
    import sys

    if "POLYPROF_BENCH_PEAK_KB" not in code:
        code = _MEASURED + code
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(run.stderr)
    peak = [int(line.split()[1]) * 1024 for line in run.stderr.splitlines() if line.startswith("POLYPROF_BENCH_PEAK_KB")]
    said = "\n".join(line for line in run.stderr.splitlines() if not line.startswith("POLYPROF_BENCH_PEAK_KB"))
    return seconds, peak[-1] if peak else 0, said
