"""A training step's name on the timeline: ``ProfilerStep#N``, as torch.profiler writes it.

::

    step_name(3)                     # "ProfilerStep#3"
    step_number("ProfilerStep#3")    # 3; None for any other name
"""

from __future__ import annotations

from typing import Any

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
