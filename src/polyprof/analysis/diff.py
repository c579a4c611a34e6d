"""Two traces compared (before and after a change): step time, and the ops and kernels that changed.

::

    from polyprof.analysis.diff import diff
    d = diff(before, after)
    d.step_ns            # (mean step before, after) or None when either has no ProfilerStep# spans
    d.operators          # op, before_ns, after_ns, delta_ns, change ("new", "vanished", or a ratio)
    d.kernels            # the same for device work, by (device kind-free) kernel name

Ops are compared by total host time, kernels by total device time, each per step where both traces
have steps (so that a longer capture is not "slower"), else in total; names that appear on one side
only are *new* or *vanished*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyprof.analysis.device import kernel_breakdown
from polyprof.analysis.operators import operator_table
from polyprof.analysis.table import Table
from polyprof.model import Trace
from polyprof.model.steps import steps_of
from polyprof.model.work import DeviceWork

COLUMNS = ("name", "before_ns", "after_ns", "delta_ns", "change")


@dataclass
class Diff:
    step_ns: tuple[float, float] | None
    per_step: bool
    operators: Table
    kernels: Table


def _mean_step(trace: Trace) -> tuple[float, int]:
    steps = steps_of(trace)
    return (float(np.mean([hi - lo for lo, hi in steps.values()])) if steps else 0.0), len(steps)


def compare_totals(before: dict[str, float], after: dict[str, float], title: str, top: int) -> Table:
    """The names of `before` and `after` (name -> time) by how much their time changed, the largest
    change first: new and vanished ones named so."""
    rows = []
    for name in set(before) | set(after):
        b, a = before.get(name), after.get(name)
        change = "new" if b is None else "vanished" if a is None else f"{a / b:.2f}x" if b else "new"
        rows.append((name, b or 0.0, a or 0.0, (a or 0.0) - (b or 0.0), change))
    rows.sort(key=lambda r: -abs(r[3]))
    return Table.of(COLUMNS, rows[:top], title)


def diff(before: Trace, after: Trace, top: int = 30) -> Diff:
    (b_step, b_n), (a_step, a_n) = _mean_step(before), _mean_step(after)
    per_step = bool(b_n and a_n)
    scale_b, scale_a = (b_n, a_n) if per_step else (1, 1)

    def ops(trace: Trace, scale: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in operator_table(trace).dicts():
            out[r["op"]] = out.get(r["op"], 0.0) + r["total_ns"] / scale
        return out

    def kernels(trace: Trace, scale: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in kernel_breakdown(trace, work=DeviceWork(trace)).dicts():
            out[r["kernel"]] = out.get(r["kernel"], 0.0) + r["total_ns"] / scale
        return out

    unit = "per step" if per_step else "in total"
    return Diff(
        step_ns=(b_step, a_step) if per_step else None,
        per_step=per_step,
        operators=compare_totals(ops(before, scale_b), ops(after, scale_a), f"Ops whose host time changed most ({unit})", top),
        kernels=compare_totals(kernels(before, scale_b), kernels(after, scale_a), f"Kernels whose device time changed most ({unit})", top),
    )
