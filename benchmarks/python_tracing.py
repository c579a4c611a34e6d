"""Python function tracing overhead per call: polyprof's python backend against VizTracer, same run.

    .venv/bin/python -m pip install viztracer   # the competitor, not a dependency of polyprof
    .venv/bin/python benchmarks/python_tracing.py [--repeats 5]

A call-heavy workload: a recursive fib(22) (57,313 calls) and a small class hierarchy (20,000
constructor and method calls). Each tracer records every call of it (VizTracer with its defaults,
a buffer large enough for every entry; polyprof with ``activities=["python"]`` and no filters); the
added time per call is (traced - untraced) / calls, the median of `--repeats` runs, the recording's
start and stop outside the timing. Target (issue #19): at most 1.0x VizTracer's added time per call.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import report


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Shape:
    def __init__(self, size: float) -> None:
        self.size = size

    def area(self) -> float:
        return 0.0


class Square(Shape):
    def area(self) -> float:
        return self.size * self.size


class Circle(Shape):
    def area(self) -> float:
        return 3.14159 * self.size * self.size


def shapes(n: int) -> float:
    total = 0.0
    for i in range(n):
        s = Square(i) if i % 2 else Circle(i)
        total += s.area()
    return total


def workload() -> None:
    fib(22)
    shapes(5000)


CALLS = 57_313 + 5_000 * 3 + 1  # fib's calls, each shape's __init__ (via Shape) and area, shapes itself


def timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def untraced() -> float:
    return timed(workload)


def polyprof_traced() -> float:
    import polyprof

    prof = polyprof.profile(activities=["python"], backend_options={"python": {"fold_libraries": False}})
    prof.start()
    took = timed(workload)
    prof.stop()
    calls = sum(1 for n in prof.trace.activities.names() if "fib" in str(n) or "area" in str(n) or "__init__" in str(n))
    assert calls >= 57_313, calls
    return took


def viztracer_traced() -> float:
    from viztracer import VizTracer

    tracer = VizTracer(tracer_entries=2_000_000, verbose=0)
    tracer.start()
    took = timed(workload)
    tracer.stop()
    tracer.clear()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"none": [], "polyprof": [], "viztracer": []}
    for _ in range(args.repeats):  # interleaved, so that the machine's drift hits all three alike
        runs["none"].append(untraced())
        runs["polyprof"].append(polyprof_traced())
        runs["viztracer"].append(viztracer_traced())
    med = {k: statistics.median(v) for k, v in runs.items()}
    added = {k: (med[k] - med["none"]) / CALLS * 1e9 for k in ("polyprof", "viztracer")}
    report("python_tracing", {
        "calls": CALLS,
        "untraced_ms": round(med["none"] * 1e3, 2),
        "traced_ms": {k: round(med[k] * 1e3, 2) for k in ("polyprof", "viztracer")},
        "added_ns_per_call": {k: round(v, 1) for k, v in added.items()},
        "polyprof_over_viztracer": round(added["polyprof"] / added["viztracer"], 2),
        "targets": {"polyprof_over_viztracer_max": 1.0},
        "meets_targets": added["polyprof"] <= added["viztracer"],
    })


if __name__ == "__main__":
    main()
