"""One recording window of a profile: the sessions made for it at warm-up and, while it records, its
start, the epoch it is read against and the flusher handing rows over. The Profile makes one per cycle
of its schedule and drives it; what a window tells besides its recording goes to its listeners
(engine/listeners.py).

::

    window = Window.prepared(selection, config, options, call_timeout_s, abandoned)  # warm-up
    window.start(step, flush_interval_s, listeners)       # the training thread: the recorders start
    trace = window.dump(metadata, limits)                 # what it holds so far, while it records
    window_end = window.stop(ring_s)                      # the training thread: the recorders stop
    trace = window.finish(metadata, call_timeout_s, ...)  # the writer: collect -> merge -> Trace
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from polyprof._version import __version__
from polyprof.engine.listeners import WindowListener
from polyprof.engine.sessions import Flusher, SessionSet
from polyprof.merge import chosen_drop, merge
from polyprof.model import BackendStatus, CollectedPart, Trace
from polyprof.plugin.backend import ProfileConfig
from polyprof.plugin.clock import epoch_offset, host_ns

#: how long a dump waits for a hand-over in progress to end (past it, the dump goes on without its rows)
HANDOVER_WAIT_S = 1.0


def trace_metadata(
    user: Mapping[str, Any], activities: Iterable[str], epoch: Any, partial: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A window's trace metadata: the user's and front ends' keys, and polyprof's own (its version,
    activities, clock; `partial` for a trace of part of a window). The one place it is built."""
    own: dict[str, Any] = {
        "version": __version__,
        "activities": sorted(activities),
        "clock": {
            "host": "perf_counter_ns",
            "epoch_offset_ns": epoch.offset_ns,
            "epoch_uncertainty_ns": epoch.uncertainty_ns,
        },
    }
    if partial is not None:
        own["partial"] = partial
    return {**user, "polyprof": own}


def call_observers(observers: Iterable[Any], call: str) -> None:
    """``start()`` or ``stop()`` of each window observer (torch's ExecutionTraceObserver); a failure is
    a warning for the user, never a lost trace."""
    from polyprof.engine.guard import describe
    from polyprof.errors import warn_user

    for obs in observers:
        try:
            getattr(obs, call)()
        except Exception as exc:
            warn_user(f"polyprof: {type(obs).__name__}.{call}() raised {describe(exc)}")


def status_problems(statuses: Iterable[BackendStatus]) -> list[str]:
    """One line per backend problem of a window (from its trace's snapshot of each backend's status, so
    that the warning, the summary and the file say the same): errors, warnings, rejected and dropped rows."""
    out = []
    for st in statuses:
        problems = list(st.errors) + list(st.warnings)
        if st.rejected:
            reasons = ", ".join(f"{k}: {v}" for k, v in st.rejected_reasons.items())
            problems.append(f"{st.rejected} malformed rows rejected ({reasons})")
        problems += [f"dropped {n} {what}" for what, n in st.dropped.items() if not chosen_drop(what)]
        out += [f"polyprof backend {st.name!r}: {msg}" for msg in problems]
    return out


class Window:
    """See the module docstring."""

    def __init__(self, sessions: SessionSet) -> None:
        self.sessions = sessions
        self.flusher: Flusher | None = None
        self.recording = False
        self.start_ns = 0
        self.end_ns = 0
        self.epoch: Any = None
        self.listeners: Sequence[WindowListener] = ()
        self._ring_start_ns = 0
        self._ended: list[tuple[WindowListener, Any]] = []

    @classmethod
    def prepared(
        cls, selection: Any, config: ProfileConfig, options: Mapping[str, Mapping[str, Any]], call_timeout_s: float,
        abandoned: Mapping[str, str],
    ) -> Window:
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
        self.listeners = listeners
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

    def dump(self, metadata: Mapping[str, Any], activities: Iterable[str], limits: Any,
             last_s: float | None = None) -> Trace:
        """A trace of what the recording window holds now (a flush first; its parts reach the listeners,
        and the ring lets go of parts as flushes come, not here), of its last `last_s` seconds where
        given. Backends that hand rows over only at the window's end are named in the trace's
        ``polyprof.partial``; the parts' statuses are not changed (the merge copies them)."""
        if not self.recording:
            raise RuntimeError("dump() of a window that is not recording")
        now = host_ns()
        start = self.start_ns if last_s is None else max(self.start_ns, now - int(last_s * 1e9))
        quiet = self.flusher.between_handovers(HANDOVER_WAIT_S) if self.flusher else contextlib.nullcontext()
        with quiet:  # a hand-over going on holds its sessions: their rows are in its part, once it is done
            new = self.sessions.flush()
            for listener in self.listeners:
                listener.on_parts(new, None)
            parts = [p for h in self.sessions.handles for p in list(h.parts)]
        flushed = sorted({p.backend for p in parts})
        parts += self.sessions.unfinished_now(now)  # the steps and spans still open (a hang's)
        offset = self.epoch.offset_ns
        meta = trace_metadata(metadata, activities, self.epoch, partial={
            "ended": "a dump while recording",
            "covered_epoch_ns": [start + offset, now + offset],
            "backends_flushed": flushed,
            "not_in_it": sorted({h.name for h in self.sessions.handles if h.name not in flushed}),
        })
        return merge(parts, window=(start, now), epoch_offset_ns=offset, limits=limits, metadata=meta)

    def stop(self, ring_s: float | None = None) -> int:
        """The recorders stop (the training thread's part of the window's end) and the listeners hear of
        it; its end time. With `ring_s`, the trace will cover only the last `ring_s` seconds."""
        self.end_ns = window_end = host_ns()
        if self.flusher is not None:
            self.flusher.stop()
        self.sessions.stop(window_end)
        self.recording = False
        self._ring_start_ns = (
            self.start_ns if ring_s is None else max(self.start_ns, window_end - int(ring_s * 1e9))
        )
        self._ended = [(listener, listener.on_window_end()) for listener in self.listeners]
        return window_end

    def finish(
        self,
        metadata: dict[str, Any],
        call_timeout_s: float,
        *,
        on_collected: Callable[[], Any] = lambda: None,
        paused: Mapping[str, list[tuple[int, int]]] | None = None,
        kind_filters: Any = None,
        limits: Any = None,
        warnings: list[str] | None = None,
    ) -> Trace:
        """The stopped window's trace (the writer's part): the flusher's last hand-over and each session's
        collect (then `on_collected`), the parts to the listeners (a listener's OSError becomes a line in
        `warnings`), and the merge, timed in ``trace.timings_ms["merge"]``."""
        if self.flusher is not None:
            self.flusher.join(call_timeout_s)
        parts = self.sessions.collect()
        on_collected()
        info = {"window_end": self.end_ns, "collected": sorted({p.backend for p in parts})}
        for listener, token in self._ended:
            try:
                listener.on_collected(token, parts, info)
            except OSError as exc:
                if warnings is not None:
                    warnings.append(str(exc))
        started = time.perf_counter()
        trace = merge(
            parts,
            window=(self._ring_start_ns, self.end_ns),
            epoch_offset_ns=self.epoch.offset_ns,
            metadata=metadata,
            kind_filters=kind_filters,
            paused=paused,
            limits=limits,
        )
        trace.timings_ms["merge"] = round((time.perf_counter() - started) * 1e3, 3)
        return trace

    def abandon(self) -> None:
        """Release the sessions without a trace (a start that failed)."""
        if self.flusher is not None:
            self.flusher.stop()
            self.flusher = None
        self.sessions.abandon()
