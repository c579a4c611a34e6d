"""Training steps counted without code changes, for captures that start and stop at step boundaries.

Two sources, as torch's ``KinetoStepTracker`` has: each optimizer's ``step()`` (torch's global
optimizer post-hook, installed now or when the program imports torch) and
``polyprof.profiler.profile.step()``. Each source keeps its own count and the step is the largest of
them, so a loop that does both, or steps two optimizers, still counts one step per iteration::

    tracker.install()                  # once; cheap: one Python call per optimizer step
    tracker.add_listener(on_step)      # on_step(step) runs on the training thread at each new step
    tracker.step, tracker.sources      # steps so far; which sources have counted
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("polyprof.ondemand")


class StepTracker:
    def __init__(self) -> None:
        self.step = 0
        self.sources: set[str] = set()
        self.seconds_per_step: float | None = None  # a running mean of the recent steps
        self._counts: dict[Any, int] = {}
        self._last = 0.0
        self._listeners: list[Callable[[int], None]] = []
        self._lock = threading.Lock()
        self._installed = False
        self._hook: Any = None

    def install(self) -> None:
        """Count optimizer steps from now on (at once when torch is imported, else when it is)."""
        if self._installed:
            return
        self._installed = True
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "optim"):
            self._with_torch(torch)
        else:
            from polyprof.backends.torch.import_hook import PostImportHook

            self._hook = PostImportHook("torch", self._with_torch)
            self._hook.install()

    @property
    def installed(self) -> bool:
        return self._installed

    def _with_torch(self, torch: Any) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except Exception as exc:  # a torch without the hook: profile.step() is the only source
            log.warning("polyprof on-demand: optimizer steps cannot be counted (%s)", exc)
            return
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self.increment(("optimizer", id(optimizer))))

    def increment(self, source: Any) -> None:
        """One step of `source` (an optimizer, or "ProfilerStep"); listeners hear of each new step."""
        with self._lock:
            count = self._counts.get(source, self.step) + 1  # a new source joins at the current step
            self._counts[source] = count
            self.sources.add(source[0] if isinstance(source, tuple) else str(source))
            if count <= self.step:
                return
            self.step = count
            now = time.monotonic()
            if self._last:
                took = now - self._last
                self.seconds_per_step = took if self.seconds_per_step is None else 0.8 * self.seconds_per_step + 0.2 * took
            self._last = now
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(count)
            except Exception:  # never the training loop's problem
                log.exception("polyprof on-demand: a step listener failed")

    def add_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


tracker = StepTracker()


def profiler_stepped() -> None:
    """``polyprof.profiler.profile.step()`` was called (counted once the tracker is installed)."""
    if tracker.installed:
        tracker.increment("ProfilerStep")
