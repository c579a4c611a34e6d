"""One recording window of a profile: the sessions made for it at warm-up and, while it records, its
start, the epoch it is read against and the flusher handing rows over. The Profile makes one per cycle
of its schedule and drives it; what a window tells besides its recording goes to its listeners
(engine/listeners.py).

::

    window = Window.prepared(selection, config, options, call_timeout_s, abandoned)  # warm-up
    window.start(step, flush_interval_s, listeners)       # the training thread: the recorders start
    parts = window.parts_so_far(listeners)                # a dump while it records
    window_end = window.stop()                            # the training thread: the recorders stop
    parts = window.collect(call_timeout_s)                # the writer: every part of the window
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polyprof.backend import ProfileConfig
from polyprof.clock import epoch_offset, host_ns
from polyprof.engine.listeners import WindowListener
from polyprof.engine.sessions import Flusher, SessionSet
from polyprof.model import CollectedPart


class Window:
    """See the module docstring."""

    def __init__(self, sessions: SessionSet) -> None:
        self.sessions = sessions
        self.flusher: Flusher | None = None
        self.recording = False
        self.start_ns = 0
        self.epoch: Any = None

    @classmethod
    def prepared(
        cls, selection: Any, config: ProfileConfig, options: Mapping[str, Mapping[str, Any]], call_timeout_s: float,
        abandoned: Mapping[str, str],
    ) -> Window:  # fmt: skip
        """A window whose sessions are made and prepared (a schedule's warm-up), not yet recording."""
        sessions = SessionSet.create(selection, config, options, call_timeout_s, abandoned)
        sessions.prepare()
        return cls(sessions)

    def read_epoch(self) -> None:
        """The epoch the window's times are read against (before its observers and recorders start)."""
        self.epoch = epoch_offset()

    def start(self, step: int, flush_interval_s: float | None, listeners: Sequence[WindowListener]) -> None:
        """The recorders start; the listeners hear of it; a flusher hands rows over every
        `flush_interval_s` where a session can (to the listeners that want parts)."""
        self.start_ns = host_ns()
        self.sessions.start(self.start_ns)
        self.recording = True
        handles = self.sessions.handles
        info = {
            "window_start": self.start_ns,
            "step": step,
            "backends": sorted(h.name for h in handles if h.recording),
            "flushing": sorted(h.name for h in handles if h.flushing),
        }
        for listener in listeners:
            listener.on_window_start(info)
        wanting = [listener for listener in listeners if listener.wants_parts]

        def on_parts(parts: list[CollectedPart]) -> None:
            for listener in wanting:
                listener.on_parts(parts, self.sessions)

        if flush_interval_s is not None and self.sessions.flushing:
            self.flusher = Flusher(self.sessions, flush_interval_s, on_parts if wanting else None)

    def parts_so_far(self, listeners: Sequence[WindowListener]) -> list[CollectedPart]:
        """A flush now (its parts to the listeners; the ring lets go of parts as flushes come, not here),
        then every part the window holds."""
        new = self.sessions.flush()
        for listener in listeners:
            listener.on_parts(new, None)
        return [p for h in self.sessions.handles for p in list(h.parts)]

    def stop(self) -> int:
        """The recorders stop (the training thread's part of the window's end); its end time."""
        window_end = host_ns()
        if self.flusher is not None:
            self.flusher.stop()
        self.sessions.stop(window_end)
        self.recording = False
        return window_end

    def collect(self, call_timeout_s: float) -> list[CollectedPart]:
        """Every part of the stopped window (the writer's part): the flusher's last hand-over, then each
        session's collect."""
        if self.flusher is not None:
            self.flusher.join(call_timeout_s)
        return self.sessions.collect()

    def abandon(self) -> None:
        """Release the sessions without a trace (a start that failed)."""
        if self.flusher is not None:
            self.flusher.stop()
            self.flusher = None
        self.sessions.abandon()
