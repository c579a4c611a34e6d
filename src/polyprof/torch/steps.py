"""Training steps, counted without code changes, and a capture that starts at the same step on every rank.

``tracker`` counts steps from two sources, as torch's ``KinetoStepTracker`` does: each optimizer's
``step()`` (torch's global optimizer post-hook, installed now or when the program imports torch) and
``polyprof.profiler.profile.step()``. Each source keeps its own count and the step is the largest of
them, so a loop that does both, or steps two optimizers, still counts one step per iteration::

    tracker.install()                  # once; cheap: one Python call per optimizer step
    tracker.add_listener(on_step)      # on_step(step) runs on the training thread at each new step
    tracker.step, tracker.sources      # steps so far; which sources have counted

``polyprof run --duration D`` under torchrun (``WORLD_SIZE`` > 1) does not start recording with the
script: ranks reach the same step at different times (imports, data loading, the rendezvous), and a
window that starts with each process would compare different steps. Instead, once
``init_process_group`` returns, rank 0 names the optimizer step to start after (the next one) through
the job's store, every rank counts its optimizer steps (``torch.optim``'s global step post-hook, the
same signal Kineto's on-demand tracing uses, through ``tracker``), and each starts recording right after
that step::

    start = SyncedStart(on_start=begin_window)   # begin_window() runs on the training thread
    start.install()                              # now, or when the script imports torch
    ...
    start.agreed_step                            # the step every rank started after (None: not yet)
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from polyprof.torch.import_hook import PostImportHook
from polyprof.torch.job_store import job_store

AGREE_TIMEOUT_S = 60.0

log = logging.getLogger("polyprof.steps")


def when_torch_is_imported(callback: Callable[[Any], None]) -> PostImportHook | None:
    """Call `callback(torch)` now when the program has imported torch, else as it does (the hook returned,
    to remove)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "optim"):
        callback(torch)
        return None
    hook = PostImportHook("torch", callback)
    hook.install()
    return hook


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
        self._hook = when_torch_is_imported(self._with_torch)

    @property
    def installed(self) -> bool:
        return self._installed

    def _with_torch(self, torch: Any) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except Exception as exc:  # a torch without the hook: profile.step() is the only source
            log.warning("polyprof: optimizer steps cannot be counted (%s)", exc)
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
                log.exception("polyprof: a step listener failed")

    def add_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


tracker = StepTracker()


class OptimizerStepSpans:
    """A ``ProfilerStep#N`` span from the end of the N-th step (an optimizer's ``step()``, counted by
    :data:`tracker`) to the end of the next, on the thread that steps: the steps of a script run without
    a schedule (``polyprof run``). What comes before the first step is the script's set-up::

        spans = OptimizerStepSpans()
        spans.install()        # now, or when the script imports torch
        ...
        spans.remove()         # the open span ends (on the thread that opened it)
        spans.stepped_aside    # True: the script marks its own steps

    A script that marks its own steps (a ``ProfilerStep#N`` annotation open when its optimizer steps)
    keeps them alone: from that step on no span of this one opens, so no step is counted twice.
    """

    def __init__(self) -> None:
        from polyprof.engine.step_spans import StepSpans

        self._spans = StepSpans()
        self._thread: int | None = None
        self.stepped_aside = False

    def install(self) -> None:
        tracker.install()
        tracker.add_listener(self._stepped)

    def _stepped(self, step: int) -> None:
        from polyprof import annotations
        from polyprof.model.steps import step_number

        self._spans.exit()  # ours first: what is open now is the script's
        if any(step_number(state[0]) is not None for state in annotations.open_states(annotations.recorder.buffer())):
            self.stepped_aside = True
            tracker.remove_listener(self._stepped)
            log.info("polyprof: the script marks its own ProfilerStep#N spans; polyprof run adds none")
            return
        self._thread = threading.get_ident()
        self._spans.enter(step)

    def remove(self) -> None:
        tracker.remove_listener(self._stepped)
        if self._thread == threading.get_ident():  # a span ends on its own thread's timeline
            self._spans.exit()


def profiler_stepped() -> None:
    """``polyprof.profiler.profile.step()`` was called (counted once the tracker is installed)."""
    if tracker.installed:
        tracker.increment("ProfilerStep")


def distributed_launch() -> bool:
    """Whether this process is one rank of several, as torchrun (or an env:// launch) says."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


class SyncedStart:
    def __init__(self, on_start: Callable[[], None]) -> None:
        self.on_start = on_start
        self.agreed_step: int | None = None
        self.started = False
        self.problem = ""
        self._hook: PostImportHook | None = None
        self._original_init: Any = None

    @property
    def steps(self) -> int:
        return tracker.step

    def install(self) -> None:
        tracker.install()
        tracker.add_listener(self._stepped)
        self._hook = when_torch_is_imported(self._with_torch)

    def _with_torch(self, torch: Any) -> None:
        try:
            import torch.distributed as dist
        except Exception as exc:  # a torch without it: nothing to agree on
            self.problem = f"torch has no distributed package ({exc})"
            return
        if dist.is_available() and dist.is_initialized():
            self._agree(dist)
            return
        original = dist.init_process_group
        watch = self

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            watch._agree(dist)
            return result

        init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        self._original_init = original
        dist.init_process_group = init_process_group

    def _agree(self, dist: Any) -> None:
        """Rank 0 names the step to start after (its next); the others read it from the store."""
        key = f"polyprof/run/start_step/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        try:
            store = job_store(AGREE_TIMEOUT_S)
            if store is None:
                raise RuntimeError("MASTER_ADDR/MASTER_PORT do not say where the job's store is")
            if dist.get_rank() == 0:
                store.set(key, str(self.steps + 1))
            store.wait([key], timedelta(seconds=AGREE_TIMEOUT_S))
            self.agreed_step = int(store.get(key))
        except Exception as exc:  # no store to reach: start at this rank's next step, said in the trace
            self.problem = f"the start step could not be agreed through the store ({type(exc).__name__}: {exc})"
            self.agreed_step = self.steps + 1

    def _stepped(self, step: int) -> None:
        if not self.started and self.agreed_step is not None and step >= self.agreed_step:
            self.started = True
            self.remove()
            self.on_start()

    def remove(self) -> None:
        tracker.remove_listener(self._stepped)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        dist = sys.modules.get("torch.distributed")
        if self._original_init is not None and dist is not None:
            if getattr(dist.init_process_group, "__wrapped__", None) is self._original_init:
                dist.init_process_group = self._original_init
            self._original_init = None
