"""A training step's name on the timeline: ``ProfilerStep#N``, as torch.profiler writes it.

::

    step_name(3)                     # "ProfilerStep#3"
    step_number("ProfilerStep#3")    # 3; None for any other name
    step_rows(trace)                 # {3: row of the longest ProfilerStep#3 span, ...}
    steps_of(trace)                  # {3: (start, end) of that span, ...}
"""

from __future__ import annotations

from typing import Any

import numpy as np

STEP_PREFIX = "ProfilerStep#"


def step_name(number: int) -> str:
    return f"{STEP_PREFIX}{number}"


def step_number(name: Any) -> int | None:
    """N of a ``ProfilerStep#N`` name, else None."""
    if isinstance(name, str) and name.startswith(STEP_PREFIX):
        digits = name[len(STEP_PREFIX):]
        if digits.isascii() and digits.isdigit():
            return int(digits)
    return None


def step_rows(trace: Any) -> dict[int, int]:
    """Step number -> the row of its longest ``ProfilerStep#N`` span."""
    acts = trace.activities
    if not len(acts):
        return {}
    names = acts.strings.strings
    step_of = {c: n for c, name in enumerate(names) if (n := step_number(name)) is not None}
    out: dict[int, int] = {}
    dur = acts["end"] - acts["start"]
    for row in np.flatnonzero(np.isin(acts["name"], list(step_of))).tolist():
        n = step_of[int(acts["name"][row])]
        if n not in out or dur[row] > dur[out[n]]:
            out[n] = row
    return dict(sorted(out.items()))


def steps_of(trace: Any) -> dict[int, tuple[int, int]]:
    """Step number -> (start, end) of its longest ``ProfilerStep#N`` span."""
    acts = trace.activities
    return {n: (int(acts["start"][r]), int(acts["end"][r])) for n, r in step_rows(trace).items()}
