"""Shared helpers for the benchmarks: machine description and result printing."""

from __future__ import annotations

import json
import os
import platform
import statistics
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


def per_call_ns(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Median over `repeats` batches of the wall time per iteration of fn(n)."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def report(name: str, results: dict) -> None:
    print(json.dumps({"benchmark": name, "machine": machine(), **results}, indent=2))
