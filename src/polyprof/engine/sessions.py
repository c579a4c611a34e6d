"""The sessions of one recording window, each call into a backend guarded and time-limited.

The window's life, and on which thread each part runs::

    window = SessionSet.create(selection, config, options, call_timeout_s)   # at PREPARE
    window.prepare()
    window.start()                       # training thread: start every session, correlation targets
    window.stop()                        # training thread: stop every session (last started first)
    parts = window.collect()             # background writer: collect, seal, close
    window.abandon()                     # instead of stop+collect, when a start failed

A session that raises, hangs past the time limit or hands over bad rows becomes its backend's status
(errors, ``failed``, ``rejected``), never the user's exception. While recording, a session with
``flush(sink)`` hands over completed rows from the :class:`Flusher` thread.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from polyprof.engine.guard import CallOutcome, describe, guarded_call, release_worker
from polyprof.engine.selection import Chosen, Selection
from polyprof.errors import BackendContractError, PolyprofWarning
from polyprof.model import BACKEND_FAILED, BACKEND_UNAVAILABLE, BackendStatus, CollectedPart
from polyprof.plugin import correlation
from polyprof.plugin.backend import REQUIRED_SESSION_METHODS, ProfileConfig, SessionContext
from polyprof.plugin.sink import Sink
from polyprof.plugin.traits import SessionTraits, backend_traits, session_trait_problems, session_traits

DEFAULT_CALL_TIMEOUT_S = 30.0
#: sessions with flush(sink) hand over completed rows this often while recording: it bounds what a
#: window holds in its recorders, and the conversion work is done while recording instead of after
DEFAULT_FLUSH_INTERVAL_S = 10.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (restored even when a backend's collect is abandoned)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Handle:
    """One backend's session in one window: its context, status and what it handed over so far."""

    __slots__ = ("chosen", "session", "ctx", "status", "started", "alive", "timed_out", "parts", "lock")

    def __init__(self, chosen: Chosen, ctx: SessionContext) -> None:
        self.chosen = chosen
        self.session: Any = None
        self.ctx = ctx
        self.status = ctx.status
        self.started = False
        self.alive = True
        self.timed_out = False
        self.parts: list[CollectedPart] = []
        self.lock = threading.Lock()  # flush never runs at the same time as collect (it may with stop)

    @property
    def name(self) -> str:
        return self.chosen.name

    @property
    def recording(self) -> bool:
        return self.alive and self.started

    @property
    def flushing(self) -> bool:
        """Recording, with a session that hands rows over while it records (``flush``)."""
        return self.recording and callable(getattr(self.session, "flush", None))

    @property
    def traits(self) -> SessionTraits:
        return session_traits(self.session)

    def seal(self, sink: Sink) -> CollectedPart:
        return sink.seal(self.status, context_scoped=backend_traits(self.chosen.entry.backend).context_scoped_spans)


class SessionSet:
    """See the module docstring."""

    def __init__(
        self, handles: list[Handle], unavailable: list[Chosen], call_timeout_s: float, broken: list | None = None
    ) -> None:
        self.handles = handles
        self.unavailable = unavailable
        self.broken = broken or []
        self.call_timeout_s = call_timeout_s
        self.window: tuple[int, int] = (0, 0)

    @classmethod
    def create(
        cls,
        selection: Selection,
        config: ProfileConfig,
        options: Mapping[str, Mapping[str, Any]],
        call_timeout_s: float,
        abandoned: Mapping[str, str] | None = None,
    ) -> SessionSet:
        """The window's sessions. A backend in `abandoned` (name -> why: a call of an earlier window
        hung) gets no new session: it is written as failed, and no thread is left behind per cycle."""
        handles = []
        for chosen in selection.selected:
            entry = chosen.entry
            if abandoned and entry.name in abandoned:
                ctx = SessionContext(entry.name, {}, BackendStatus(entry.name, BACKEND_FAILED, reason=abandoned[entry.name]))
                dead = Handle(chosen, ctx)
                dead.alive = False
                handles.append(dead)
                continue
            status = BackendStatus(
                entry.name, version=entry.version or str(chosen.availability.versions.get("version", ""))
            )
            ctx = SessionContext(entry.name, options.get(entry.name), status)
            handle = Handle(chosen, ctx)
            # polyprof's own backends (in_process) are called directly: no guard thread exists for a CPU
            # profile, which tools that sample every thread (torch's Python tracer) would see
            direct = backend_traits(entry.backend).in_process
            outcome = guarded_call(
                status, "create_session", entry.backend.create_session, config, ctx,
                timeout_s=None if direct else call_timeout_s,
            )
            if outcome.ok:
                missing = [m for m in REQUIRED_SESSION_METHODS if not callable(getattr(outcome.value, m, None))]
                problems = session_trait_problems(outcome.value)
                if missing:
                    status.errors.append(f"create_session() returned a session without {', '.join(missing)}")
                elif problems:
                    status.errors.append(str(BackendContractError(entry.name, "its session " + "; ".join(problems))))
                else:
                    handle.session = outcome.value
            handle.alive = handle.session is not None
            handle.timed_out = outcome.timed_out
            handles.append(handle)
        release_worker()
        return cls(handles, list(selection.unavailable), call_timeout_s, list(selection.broken))

    # -- guarded calls ------------------------------------------------------------------------------
    def call(self, h: Handle, what: str, fn: Callable, *args: Any) -> CallOutcome:
        """`fn(*args)` guarded; on the calling thread for thread-affine and in-process sessions (polyprof's
        own bookkeeping, which cannot hang), else time-limited on a guard thread. The time it took is
        added to the backend's ``timings_ms``."""
        direct = h.traits.thread_affine or h.traits.in_process
        started = time.perf_counter()
        outcome = guarded_call(h.status, what, fn, *args, timeout_s=None if direct else self.call_timeout_s)
        h.status.add_timing(what, (time.perf_counter() - started) * 1e3)
        if outcome.timed_out:
            h.alive = False
            h.timed_out = True
        return outcome

    def abandoned(self) -> dict[str, str]:
        """Backends with a call that hung in this window (name -> what hung)."""
        return {
            h.name: f"a call of an earlier window hung ({h.status.errors[-1] if h.status.errors else 'timed out'}); "
            "left out of later windows"
            for h in self.handles
            if h.timed_out
        }

    def live(self) -> list[Handle]:
        return [h for h in self.handles if h.alive and h.session is not None]

    # -- the window ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        for h in self.live():
            if not self.call(h, "prepare", h.session.prepare).ok:
                self.close(h)
        release_worker()

    def start(self, window_start: int) -> None:
        self.window = (window_start, window_start)
        targets = []
        for h in self.live():
            h.ctx.window_start = window_start
            if self.call(h, "start", h.session.start).ok:
                h.started = True
                push, pop = getattr(h.session, "push_correlation", None), getattr(h.session, "pop_correlation", None)
                if callable(push) and callable(pop):
                    targets.append(correlation.CorrelationTarget(push, pop, self._correlation_failed(h)))
            else:
                self.close(h)
        correlation.set_targets(tuple(targets))
        release_worker()

    @staticmethod
    def _correlation_failed(handle: Handle) -> Callable:
        def on_error(target: correlation.CorrelationTarget, exc: BaseException) -> None:
            handle.status.errors.append(f"push/pop_correlation raised {describe(exc)}; correlation disabled")
            correlation.set_targets(tuple(t for t in correlation.targets if t is not target))

        return on_error

    def stop(self, window_end: int) -> None:
        """Stop every recording session (the training thread's part of the window's end)."""
        correlation.set_targets(())
        self.window = (self.window[0], window_end)
        for h in self.handles:
            h.ctx.window_end = window_end
        # last started, first stopped: a backend started inside another's session (polyprof's CUDA
        # tracing inside torch's collector, which takes CUPTI) stops while the outer one still runs
        for h in reversed(self.handles):
            if h.recording and self.call(h, "stop", h.session.stop).timed_out:
                h.status.state = BACKEND_FAILED  # abandoned: nothing of it can be collected
        release_worker()

    def collect(self) -> list[CollectedPart]:
        """Every session's rows as sealed parts (flushed ones first), sessions closed, statuses final."""
        parts: list[CollectedPart] = []
        with gc_paused():  # collect builds many containers and no cycles: collecting them is wasted work
            for h in self.handles:
                sink = Sink(h.name)
                if h.recording:
                    with h.lock:
                        outcome = self.call(h, "collect", h.session.collect, sink)
                    if not outcome.ok:
                        # rows a failed collect emitted before raising are kept; a hung one's are not,
                        # since its thread may still be writing
                        h.status.state = BACKEND_FAILED
                    if outcome.timed_out:
                        sink.abandon(h.status, "rows after the collect time limit")
                        sink = Sink(h.name)
                self.close(h)
                if h.session is None or not h.started:
                    h.status.state = BACKEND_FAILED
                parts.extend(h.parts)
                h.parts = []
                parts.append(h.seal(sink))
        for chosen in self.unavailable:
            status = BackendStatus(
                chosen.name, BACKEND_UNAVAILABLE, reason=chosen.availability.reason, version=chosen.entry.version
            )
            parts.append(CollectedPart.empty(status))
        for entry in self.broken:
            parts.append(CollectedPart.empty(BackendStatus(entry.name or entry.reference, BACKEND_FAILED, reason=entry.error)))
        release_worker()
        return parts

    def flush(self) -> list[CollectedPart]:
        """Hand over what each flushing session has completed (called from the Flusher thread); returns
        the new parts (also kept for the window's merge)."""
        new: list[CollectedPart] = []
        for h in self.handles:
            flush = getattr(h.session, "flush", None)
            if not h.recording or not callable(flush) or not h.lock.acquire(blocking=False):
                continue
            try:
                if not h.recording:
                    continue
                sink = Sink(h.name)
                outcome = self.call(h, "flush", flush, sink)
                if outcome.timed_out:
                    sink.abandon(h.status, "rows after the flush time limit")
                    continue
                part = h.seal(sink)
                if len(part.activities) or len(part.counters) or part.devices:
                    h.parts.append(part)
                    new.append(part)
            finally:
                h.lock.release()
        release_worker()
        return new

    @property
    def flushing(self) -> bool:
        return any(h.flushing for h in self.handles)

    def unfinished_now(self, end_ns: int) -> list[CollectedPart]:
        """For a dump while recording: from each session that can say (``unfinished_now``), what is
        still open, ending at `end_ns`; parts for this dump only, not kept for the window's merge."""
        parts = []
        for h in self.handles:
            unfinished = getattr(h.session, "unfinished_now", None)
            if h.recording and callable(unfinished):
                sink = Sink(h.name)
                if not self.call(h, "unfinished_now", unfinished, sink, end_ns).timed_out:
                    part = h.seal(sink)
                    parts += [part] if len(part.activities) else []
        release_worker()
        return parts

    def abandon(self) -> None:
        """Stop and close everything (a start failed, or the profile is torn down)."""
        correlation.set_targets(())
        for h in self.handles:
            if h.recording:
                self.call(h, "stop", h.session.stop)
            self.close(h)
        release_worker()

    def close(self, h: Handle) -> None:
        if h.session is not None and h.alive:
            self.call(h, "close", h.session.close)
        h.alive = False


#: with someone waiting for the rows (a spill), the first hand-over this soon after the window starts, so
#: that a process killed in its first second leaves a trace
FIRST_FLUSH_S = 0.1


class Flusher:
    """A daemon thread that calls :meth:`SessionSet.flush` every `interval_s` while a window records.

    With `on_parts` (a spill, a ring), the first flush comes FIRST_FLUSH_S after the start, and each next
    one early by twice the time the last took: what a kill loses is what ended since the last hand-over
    that reached the spill, at most one interval even while a flush is writing."""

    def __init__(
        self, sessions: SessionSet, interval_s: float, on_parts: Callable[[list[CollectedPart]], None] | None = None
    ) -> None:
        self.sessions = sessions
        self.interval_s = interval_s
        self.on_parts = on_parts  # e.g. the spill
        self._stop = threading.Event()
        self._busy = threading.Lock()  # held through a hand-over and its on_parts
        self._thread = threading.Thread(target=self._run, name="polyprof-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait = min(FIRST_FLUSH_S, self.interval_s) if self.on_parts is not None else self.interval_s
        while not self._stop.wait(wait):
            started = time.monotonic()
            with self._busy:
                if self._stop.is_set():  # stopped while this thread woke: the window's collect has it
                    return
                try:
                    parts = self.sessions.flush()
                    if parts and self.on_parts is not None:
                        self.on_parts(parts)
                except Exception as exc:  # a backend's problem is in its status already; the spill's is said
                    warnings.warn(f"polyprof: handing over completed rows failed: {describe(exc)}", PolyprofWarning, stacklevel=1)
            took = time.monotonic() - started
            wait = max(0.0, self.interval_s - 2 * took) if self.on_parts is not None else self.interval_s

    def stop(self) -> None:
        """Ask the thread to end (it ends after the flush in progress, if any)."""
        self._stop.set()

    @contextlib.contextmanager
    def between_handovers(self, timeout_s: float) -> Iterator[None]:
        """No hand-over in progress while inside (one going on is waited for, `timeout_s` at most): for a
        dump, whose own flush skips a session that a hand-over holds and would miss the rows it takes."""
        held = self._thread.is_alive() and self._busy.acquire(timeout=timeout_s)
        try:
            yield
        finally:
            if held:
                self._busy.release()

    def join(self, timeout_s: float) -> None:
        """After :meth:`stop`: wait until no hand-over is in progress (none starts after it). The thread
        itself ends on its own: waiting for an idle one to wake costs the stop milliseconds on a busy
        machine."""
        if not self._thread.is_alive():  # ended, or not in this process (a forked child: its lock may be held)
            return
        if self._busy.acquire(timeout=timeout_s):
            self._busy.release()
