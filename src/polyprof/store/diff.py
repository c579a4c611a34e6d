"""Two stores compared (a job before and after a change), as :func:`polyprof.analysis.diff.diff`
compares two traces: the mean step, and the ops and kernels whose time changed most, per step where
both jobs have steps (summed over the ranks and divided by their steps: per rank and step), else in
total. Each side's totals come from its own store's analyses, on its own engine.

::

    from polyprof import store
    with store.open("before.polyprof") as before, store.open("after.polyprof") as after:
        d = store.diff(before, after)      # a polyprof.analysis.diff.Diff
"""

from __future__ import annotations

from typing import Any

from polyprof.analysis.diff import Diff, compare_totals

_STEPS = ("select cast(coalesce(sum(steps), 0) as bigint) as n, cast(coalesce(sum(mean_step_ns * steps), 0) as double) "
          "as ns from rank_totals")
_OPS = "select op as name, cast(sum(total_ns) as double) as ns from operators group by op"
_KERNELS = "select kernel as name, cast(sum(total_ns) as double) as ns from kernels group by kernel"


def _totals(job: Any, query: str, scale: int) -> dict[str, float]:
    return {r["name"]: r["ns"] / scale for r in job.table(query).to_pylist()}


def diff(before: Any, after: Any, top: int = 30) -> Diff:
    """The diff of two open stores (:func:`polyprof.store.open`)."""
    (b_n, b_ns), (a_n, a_ns) = (tuple(job.table(_STEPS).to_pylist()[0].values()) for job in (before, after))
    per_step = bool(b_n and a_n)
    scale_b, scale_a = (int(b_n), int(a_n)) if per_step else (1, 1)
    unit = "per step" if per_step else "in total"
    return Diff(
        step_ns=(b_ns / b_n, a_ns / a_n) if per_step else None,
        per_step=per_step,
        operators=compare_totals(_totals(before, _OPS, scale_b), _totals(after, _OPS, scale_a),
                                 f"Ops whose host time changed most ({unit})", top),
        kernels=compare_totals(_totals(before, _KERNELS, scale_b), _totals(after, _KERNELS, scale_a),
                               f"Kernels whose device time changed most ({unit})", top),
    )
