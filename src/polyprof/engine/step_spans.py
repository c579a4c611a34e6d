"""The ``ProfilerStep#N`` span around each step of a recording window.

::

    spans = StepSpans()
    spans.enter(step_num)   # after start() and after each step's transition, while recording
    spans.exit()            # at the step's end and at stop()
"""

from __future__ import annotations

from polyprof import annotations
from polyprof.model.steps import step_name


class StepSpans:
    """One open ``ProfilerStep#N`` annotation at a time."""

    def __init__(self) -> None:
        self._open: annotations.record_function | None = None

    def enter(self, step_num: int) -> None:
        self.exit()
        self._open = annotations.record_function(step_name(step_num))
        self._open.__enter__()

    def exit(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
