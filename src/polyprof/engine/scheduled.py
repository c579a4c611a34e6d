"""The schedule-driven profile: the object users hold.

::

    import polyprof

    with polyprof.profile(activities=["cpu", "opencl"]) as prof:
        run_my_program()
    prof.export_chrome_trace("trace.json.gz")

With a schedule (``torch.profiler.schedule`` semantics) the profile records only some steps::

    sched = polyprof.schedule(wait=1, warmup=1, active=2, repeat=1)
    with polyprof.profile(schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace("t.json")) as p:
        for batch in data:
            train(batch)
            p.step()

A ``step()`` that ends a window only stops the recorders: collecting, merging, the ``on_trace_ready``
handler and its file run on polyprof's background writer (:mod:`polyprof.engine.background`), so the
training loop goes on at once. ``stop()`` waits for the last window's trace and handler by default, as
torch.profiler's does (the trace is there, the handler has written its file and backend warnings have
been raised when the ``with`` block ends); ``stop(wait=False)`` returns once the recorders are stopped.
``prof.trace`` and ``prof.export_chrome_trace`` wait for the trace. Warnings about backends and an
exception from a handler reach the training thread at the next ``step()``, ``stop()`` or ``prof.trace``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from polyprof import annotations
from polyprof._version import __version__
from polyprof.backend import ProfileConfig
from polyprof.clock import host_ns
from polyprof.engine.background import Job, writer
from polyprof.engine.guard import describe
from polyprof.engine.limits import Limits
from polyprof.engine.listeners import RingListener, SpillListener, WindowListener
from polyprof.engine.merge import chosen_drop, merge
from polyprof.engine.schedule import (
    PREPARE,
    READY,
    START,
    STOP,
    TRANSITIONS,
    WARN,
    ProfilerAction,
    always_record,
    as_action,
)
from polyprof.engine.selection import (
    activity_group_name,
    check_backend_options,
    kind_filters,
    select_backends,
)
from polyprof.engine.sessions import DEFAULT_CALL_TIMEOUT_S, DEFAULT_FLUSH_INTERVAL_S
from polyprof.engine.signals import CleanStop, Signalled
from polyprof.engine.window import Window
from polyprof.errors import ConfigError, PolyprofError, warn_user
from polyprof.model import BackendStatus, Trace
from polyprof.registry import Registry
from polyprof.registry import default as default_registry

#: with a spill, completed rows are handed over (and spilled) this often
SPILL_FLUSH_INTERVAL_S = 1.0

_active_lock = threading.Lock()
_active_profile: Profile | None = None


def _positive_seconds(name: str, value: Any, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


class Profile:
    """Runs one profile; see the module docstring. Arguments are checked here, before anything starts.

    Args:
        activities: activity groups ("cpu", "opencl", ...) or ProfilerActivity members. None: every
            group whose backend is available here. A group asked for explicitly whose backends are all
            unavailable raises BackendUnavailableError with their reasons.
        schedule: step -> ProfilerAction (see :func:`polyprof.schedule`); None records start to stop.
        on_trace_ready: called with this profile when a cycle's trace is ready (on the background writer;
            ``prof.trace`` and ``prof.step_num`` inside it are the cycle's).
        backend_options: ``{"opencl": {...}}``: options handed to each backend's sessions.
        call_timeout_s: a backend's stop/collect/close running longer is abandoned.
        flush_interval_s: how often sessions that implement ``flush(sink)`` hand over completed rows
            while recording (None: only at the window's end). Default 10 s; 1 s with a spill.
        handle_signals: while the profile runs, SIGTERM and SIGHUP (what schedulers and closed terminals
            send) unwind the program like Ctrl-C; leaving the ``with`` block stops the profile (the
            trace is merged, ``on_trace_ready`` writes its file, a spill ends cleanly), then the process
            ends with the signal's own status.
        ring_s: keep only the last `ring_s` seconds of each window (host and the devices whose backends
            hand rows over while recording): older rows are let go as they age, and the trace, written on
            stop, on ``dump()`` or as a window ends, covers the last `ring_s` seconds.
        limits: size controls (:class:`polyprof.Limits` or a dict of its fields): drop host spans
            shorter than a threshold, names by pattern, kinds, and cap the rows per backend; every
            dropped row is counted in its backend's status.
        spill: a file to append what is complete to while recording (checksummed chunks, 0600), so that
            a process killed without warning leaves a trace: ``polyprof recover SPILL``. Removed once
            a trace of the profile has been written to a file.
        metadata: top-level keys added to the trace.
        activity_filters: ``{"CPU": {ActivityKind.CPU_OP}}``: of the groups named, only rows of these
            kinds are kept (an empty set keeps none); what is dropped is counted per backend.
        window_observers: objects whose ``start()`` and ``stop()`` are called as each recording window
            opens and closes (before the backends start and stop), e.g. torch's ExecutionTraceObserver.
        extra: front-end settings handed to every backend as ``ProfileConfig.extra``.
    """

    def __init__(
        self,
        activities: Iterable[Any] | None = None,
        *,
        schedule: Callable[[int], Any] | None = None,
        on_trace_ready: Callable[[Profile], Any] | None = None,
        backend_options: Mapping[str, Mapping[str, Any]] | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        flush_interval_s: float | None = DEFAULT_FLUSH_INTERVAL_S,
        spill: str | os.PathLike | None = None,
        ring_s: float | None = None,
        limits: Any = None,
        handle_signals: bool = False,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        metadata: Mapping[str, Any] | None = None,
        registry: Registry | None = None,
        record_steps: bool | None = None,
        activity_filters: Mapping[str, Iterable[int]] | None = None,
        window_observers: Iterable[Any] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        if schedule is not None and not callable(schedule):
            raise ConfigError(
                f"schedule must be a callable step -> ProfilerAction (see polyprof.schedule), got {schedule!r}"
            )
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise ConfigError(f"on_trace_ready must be callable, got {on_trace_ready!r}")
        self.call_timeout_s = _positive_seconds("call_timeout_s", call_timeout_s)
        if spill is not None and flush_interval_s == DEFAULT_FLUSH_INTERVAL_S:
            flush_interval_s = SPILL_FLUSH_INTERVAL_S
        self.ring_s = _positive_seconds("ring_s", ring_s, allow_none=True)
        self.limits = Limits.of(limits)
        self._signals = CleanStop() if handle_signals else None
        if self.ring_s is not None:  # rows are handed over often enough to age out of the ring
            flush_interval_s = min(flush_interval_s or self.ring_s, self.ring_s / 4)
        self.flush_interval_s = _positive_seconds("flush_interval_s", flush_interval_s, allow_none=True)
        self.spill_path = os.path.abspath(os.fspath(spill)) if spill is not None else None
        #: the spill and the ring: what a window tells besides its recording (engine/listeners.py)
        self._listeners: list[WindowListener] = []
        if self.spill_path is not None:
            self._listeners.append(SpillListener(self.spill_path, self._spill_header, warn_user))
        if self.ring_s is not None:
            self._listeners.append(RingListener(self.ring_s))
        self.registry = registry or default_registry
        self.schedule = schedule or always_record
        self.record_steps = schedule is not None if record_steps is None else record_steps
        self.on_trace_ready = on_trace_ready
        self._metadata: dict[str, Any] = dict(metadata or {})
        self._selection = select_backends(self.registry, activities)
        self.config = ProfileConfig(
            activities=frozenset(self._selection.groups),
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            with_modules=with_modules,
            extra=dict(extra or {}),
        )
        for entry in self._selection.broken:
            warn_user(f"polyprof: backend {entry.name or entry.reference!r} ({entry.origin}) is left out: {entry.error}")
        self._kind_filters = kind_filters(self._selection, activity_filters)
        self._backend_options = check_backend_options(self._selection, backend_options)
        self._paused: dict[str, list[tuple[int, int]]] = {}  # backend -> [start, end) collection off
        self._paused_since: dict[str, int] = {}
        self.window_observers = list(window_observers)
        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self._window: Window | None = None  # this cycle's window, from its warm-up to its end
        self._trace: Trace | None = None
        self._jobs: list[Job] = []  # this profile's windows still in the background, oldest first
        self._warnings: list[str] = []  # backend problems found in the background, for the user
        self._abandoned: dict[str, str] = {}  # backends whose call hung: no session in later windows
        self._step_span: annotations.record_function | None = None
        self._started = False
        self._merge_here = False
        #: called (on the thread that starts it) with another profile about to record while this one
        #: records; it must stop this one. None: the other profile's start is refused with an error.
        self.yield_to: Callable[[Profile], None] | None = None

    @property
    def _recording(self) -> bool:
        return self._window is not None and self._window.recording

    @property
    def backends(self) -> list[str]:
        """Names of the backends this profile runs."""
        return self._selection.names

    def toggle_collection_dynamic(self, enable: bool, activities: Iterable[Any]) -> None:
        """Stop (``enable=False``) or resume collecting the given activity groups inside a recording
        window, as torch.profiler's method does: what those groups' backends record in between is left
        out of the trace (counted under ``dropped``)."""
        groups = {activity_group_name(a) for a in activities}
        now = host_ns()
        for chosen in self._selection.serving(groups):
            name = chosen.name
            if not enable and name not in self._paused_since:
                self._paused_since[name] = now
            elif enable and name in self._paused_since:
                self._paused.setdefault(name, []).append((self._paused_since.pop(name), now))

    def _take_paused(self, window_end: int) -> dict[str, list[tuple[int, int]]]:
        for name, since in self._paused_since.items():
            self._paused.setdefault(name, []).append((since, window_end))
        self._paused_since = {name: window_end for name in self._paused_since}  # still off next window
        paused, self._paused = self._paused, {}
        return paused

    # -- the user API --------------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ending_with_signals(self.stop)

    def start(self) -> None:
        """Begin: apply the schedule's action for step 0."""
        if self._started:
            raise PolyprofError("this profile is already started; call stop() before starting it again")
        self._begin(ProfilerAction.NONE, self.schedule(self.step_num))
        self._enter_step_span()

    def step(self) -> None:
        """Mark the end of a step: advance `step_num` and apply the schedule's transition."""
        if not self._started:
            raise PolyprofError("step() called before start()")
        self._between_steps()
        self._raise_handler_error()
        self._exit_step_span()
        prev = self.current_action
        self.step_num += 1
        self._transition(prev, self.schedule(self.step_num))
        self._enter_step_span()

    def stop(self, wait: bool = True) -> None:
        """End: finish the current cycle. With `wait` (the default) returns once every window's trace is
        merged and its on_trace_ready handler has run; with ``wait=False`` once the recorders are stopped
        (``prof.trace`` then waits)."""
        if not self._started:
            return
        self._exit_step_span()
        try:
            self._end(self.current_action, wait)
        finally:
            self.current_action = ProfilerAction.NONE

    # -- the lifecycle's parts, shared with front ends that drive the transitions themselves -----------
    def _begin(self, prev: Any, cur: Any) -> None:
        """The profile starts with the transition `prev` -> `cur`; a failure releases what was set up."""
        self._started = True
        if self._signals is not None:
            self._signals.__enter__()
        self._profile_hooks("profile_started", self.config)
        try:
            self._transition(prev, cur)
        except BaseException:
            self._abandon_sessions()  # e.g. another profile is recording: release what prepare set up
            self._profile_hooks("profile_stopped")
            self._started = False
            raise

    def _between_steps(self) -> None:
        """At a step boundary, before its transition: the background's warnings reach the caller."""
        self._emit_warnings()

    def _end(self, prev: Any, wait: bool = True) -> None:
        """The profile ends from action `prev`: the last window's phases, then (with `wait`) its trace
        and handler, the spill closed, warnings and a handler's error raised."""
        self._merge_here = wait  # the caller waits anyway: merge on its thread, without a hand-over
        try:
            self._apply(TRANSITIONS[(as_action(prev), None)])
        finally:
            self._merge_here = False
            self._started = False
            self._profile_hooks("profile_stopped")
        if wait and not writer.on_writer_thread:
            for job in list(self._jobs):
                job.done.wait()
        self.close_spill(remove=False)  # the profile ended: the spill says so, and stays until a trace is written
        if self._signals is not None:
            self._signals.__exit__()  # the program's own handlers are back (a noted signal is ended in __exit__)
        self._emit_warnings()
        self._raise_handler_error()

    def _ending_with_signals(self, end: Callable[[], Any]) -> None:
        """Run `end` (the profile's stop); with handle_signals, a signal meanwhile waits until the trace is
        written, then the process ends as the first signal asked."""
        signals = self._signals
        if signals is None:
            end()
            return
        try:
            with signals.deferred():  # a second signal does not cut the stop (and the handler's file) short
                end()
        except Signalled:
            pass
        finally:
            signals.__exit__()
        signals.exit()  # if a signal came: the trace is merged and handled, now end as the signal asks

    @property
    def trace(self) -> Trace:
        """The last trace collected (waiting for it when its window's merge is still running). Raises if
        nothing has been recorded yet."""
        self._wait_for_trace()
        if self._trace is None:
            raise PolyprofError(
                "no trace has been recorded yet: profile something first (start/stop or a with block)"
            )
        return self._trace

    def _wait_for_trace(self) -> None:
        if self._jobs and not writer.on_writer_thread:
            self._jobs[-1].merged.wait()
        self._emit_warnings()
        self._raise_handler_error(merge_only=True)

    def export_chrome_trace(self, path: str) -> str:
        """Write the last trace as Kineto-dialect Chrome JSON (gzip when `path` ends in .gz), or as
        Perfetto protobuf when it ends in .pftrace or .perfetto-trace."""
        return self._export(path, None)

    def export_perfetto(self, path: str) -> str:
        """Write the last trace as a Perfetto protobuf trace (gzip when `path` ends in .gz)."""
        return self._export(path, "perfetto")

    def _export(self, path: str, format: str | None) -> str:
        from polyprof.formats.files import write_trace

        trace = self.trace
        started = time.perf_counter()
        written = write_trace(trace, path, format)
        trace.timings_ms["write"] = round((time.perf_counter() - started) * 1e3, 3)
        if not self._recording:  # a trace is on disk: the spill is not needed any more
            for listener in self._listeners:
                listener.on_trace_written()
        return written

    def dump(self, path: str) -> str:
        """Write what the current window has recorded so far, while it goes on recording (for a job that
        hangs: its state without stopping it). Backends that hand over rows while recording (``flush``)
        are in it; the others only come at the window's end (the trace's ``polyprof.partial`` lists
        them). Returns the path written."""
        from polyprof.formats.files import write_trace

        window = self._window
        if window is None or not window.recording:
            raise PolyprofError("dump() needs a recording window: nothing is being recorded now")
        now = host_ns()
        parts = window.parts_so_far(self._listeners)  # (the merge leaves their statuses alone)
        epoch = window.epoch
        flushed = sorted({p.backend for p in parts})
        meta = self._trace_metadata(epoch, partial={
            "ended": "a dump while recording",
            "covered_epoch_ns": [window.start_ns + epoch.offset_ns, now + epoch.offset_ns],
            "backends_flushed": flushed,
            "not_in_it": sorted({h.name for h in window.sessions.handles if h.name not in flushed}),
        })
        trace = merge(parts, window=(window.start_ns, now), epoch_offset_ns=epoch.offset_ns, limits=self.limits,
                      metadata=meta)
        return write_trace(trace, path)

    def add_metadata(self, key: str, value: Any) -> None:
        """A top-level key/value of the trace (value must be JSON-serialisable)."""
        self._metadata[str(key)] = value
        if self._jobs or self._trace is not None:
            self.trace.metadata[str(key)] = value

    def add_metadata_json(self, key: str, value: str) -> None:
        """Like add_metadata, with `value` already JSON text."""
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"add_metadata_json({key!r}): value is not valid JSON: {exc}") from exc
        self.add_metadata(key, parsed)

    # -- hooks for front ends --------------------------------------------------------------------------
    def _on_trace(self, trace: Trace) -> None:
        """Called on the writer with each cycle's trace, before on_trace_ready (front ends add to it)."""

    def _window_metadata(self) -> dict[str, Any]:
        """The metadata of the window now ending (taken on the training thread, as it was then)."""
        return dict(self._metadata)

    def _trace_metadata(self, epoch: Any, partial: dict[str, Any] | None = None) -> dict[str, Any]:
        """The window's trace metadata: the user's and front ends' keys, and polyprof's own (its
        version, activities, clock; `partial` for a trace of part of a window). The one place it is
        built: a window's end and a dump both take it from here."""
        own: dict[str, Any] = {
            "version": __version__,
            "activities": sorted(self.config.activities),
            "clock": {
                "host": "perf_counter_ns",
                "epoch_offset_ns": epoch.offset_ns,
                "epoch_uncertainty_ns": epoch.uncertainty_ns,
            },
        }
        if partial is not None:
            own["partial"] = partial
        return {**self._window_metadata(), "polyprof": own}

    # -- schedule machinery --------------------------------------------------------------------------
    def _profile_hooks(self, hook: str, *args: Any) -> None:
        """A backend's optional ``profile_started(config)`` / ``profile_stopped()``: the whole profile,
        every step of a schedule (OpenCL makes queues created at any step profiling-enabled). A failure
        is a warning naming the backend, never the user's exception."""
        for chosen in self._selection.selected:
            fn = getattr(chosen.entry.backend, hook, None)
            if not callable(fn):
                continue
            try:
                fn(*args)
            except Exception as exc:
                warn_user(f"polyprof backend {chosen.name!r}: {hook}() raised {describe(exc)}")

    def _transition(self, prev: Any, cur: Any) -> None:
        prev, cur = as_action(prev), as_action(cur)
        if cur is ProfilerAction.DEVICE_STOPPED:
            raise ConfigError(
                "ProfilerAction.DEVICE_STOPPED is set internally by the profiler and must not be returned by "
                "a user-provided schedule"
            )
        self._apply(TRANSITIONS[(prev, cur)], f"{prev.name} followed by {cur.name}")
        self.current_action = cur

    def _apply(self, phases: tuple[str, ...], transition: str = "") -> None:
        for phase in phases:
            if phase == PREPARE:
                self._prepare()
            elif phase == START:
                self._start_recording()
            elif phase == STOP:
                self._stop_recording(save=READY in phases)
            elif phase == WARN:  # torch's words (this cycle's trace is not saved)
                warn_user(f"Incorrect schedule: {transition}", UserWarning)

    def _enter_step_span(self) -> None:
        if self.record_steps and self._recording:
            self._step_span = annotations.record_function(f"ProfilerStep#{self.step_num}")
            self._step_span.__enter__()

    def _exit_step_span(self) -> None:
        if self._step_span is not None:
            self._step_span.__exit__(None, None, None)
            self._step_span = None

    # -- lifecycle phases ----------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._window is not None:
            return
        self._window = Window.prepared(self._selection, self.config, self._backend_options, self.call_timeout_s,
                                       self._abandoned)  # fmt: skip

    def _start_recording(self) -> None:
        global _active_profile
        with _active_lock:
            other = _active_profile if _active_profile is not self else None
        if other is not None and other.yield_to is not None:
            other.yield_to(self)  # e.g. polyprof run's whole-run profile, when the script starts its own
        with _active_lock:
            if _active_profile is not None and _active_profile is not self:
                raise PolyprofError(
                    "another polyprof profile is already recording in this process; stop it first"
                )
            _active_profile = self
        window = self._window
        assert window is not None
        if self._jobs and not writer.on_writer_thread:
            # a backend's recorder may be process-wide (torch's observer): the last window's collect
            # must be done with it before it records again (a warm-up step in between hides the wait)
            self._jobs[-1].collected.wait()
        window.read_epoch()
        self._window_observers("start")
        window.start(self.step_num, self.flush_interval_s, self._listeners)

    def _spill_header(self) -> dict[str, Any]:
        import socket
        import sys

        return {
            "version": __version__,
            "pid": os.getpid(),
            "host_name": socket.gethostname(),
            "argv": list(sys.argv),
            "activities": sorted(self.config.activities),
            "epoch_offset_ns": self._window.epoch.offset_ns if self._window is not None else 0,
            "flush_interval_s": self.flush_interval_s,
            "metadata": self._window_metadata(),
        }

    def close_spill(self, remove: bool = True) -> None:
        """End the spill cleanly; with `remove` (a trace has been written), delete it."""
        for listener in self._listeners:
            listener.close(remove)

    def _window_observers(self, call: str) -> None:
        for obs in self.window_observers:
            try:
                getattr(obs, call)()
            except Exception as exc:  # an observer's failure is the user's to see, never a lost trace
                warn_user(f"polyprof: {type(obs).__name__}.{call}() raised {describe(exc)}")

    def _stop_recording(self, save: bool = True) -> None:
        """The training thread's part of a window's end: stop the recorders, hand the rest over."""
        global _active_profile
        called = time.perf_counter()
        self._window_observers("stop")
        ending, self._window = self._window, None
        assert ending is not None
        window_end = ending.stop()
        self._abandoned.update(ending.sessions.abandoned())  # a stop that hung: no session next window
        with _active_lock:
            _active_profile = None
        start = ending.start_ns
        if self.ring_s is not None:
            start = max(start, window_end - int(self.ring_s * 1e9))
        window = (start, window_end)
        epoch = ending.epoch
        meta = self._trace_metadata(epoch)
        paused = self._take_paused(window_end)
        step_num = self.step_num
        handler = self.on_trace_ready if save else None
        ended = [(listener, listener.on_window_end()) for listener in self._listeners]

        def run(job: Job) -> Trace:
            parts = ending.collect(self.call_timeout_s)
            self._abandoned.update(ending.sessions.abandoned())
            job.collected.set()
            info = {"window_end": window_end, "collected": sorted({p.backend for p in parts})}
            for listener, token in ended:
                try:
                    listener.on_collected(token, parts, info)
                except OSError as exc:
                    self._warnings.append(str(exc))
            started = time.perf_counter()
            trace = merge(
                parts,
                window=window,
                epoch_offset_ns=epoch.offset_ns,
                metadata=meta,
                kind_filters=self._kind_filters,
                paused=paused,
                limits=self.limits,
            )
            trace.timings_ms["merge"] = round((time.perf_counter() - started) * 1e3, 3)
            trace.timings_ms["window_end_call"] = blocked_ms
            self._warnings.extend(self._problems(trace.backends.values()))
            del parts  # their columns were copied into the trace: free them before the handler runs
            self._on_trace(trace)
            self._trace = trace
            job.merged.set()
            if handler is not None:
                self._call_handler(handler, step_num)
            return trace

        blocked_ms = 0.0
        here = writer.on_writer_thread or (self._merge_here and not any(not j.done.is_set() for j in self._jobs))
        job = Job(run) if here else writer.submit(run)
        blocked_ms = round((time.perf_counter() - called) * 1e3, 3)
        if here:  # stop() that waits anyway, or a window ended from inside a handler: run it here
            try:
                job.result = run(job)
            except BaseException as exc:  # kept for the user, as the writer keeps it
                job.error = exc
            finally:
                job.finish()
        self._jobs = [j for j in self._jobs if not j.done.is_set()] + [job]

    def _call_handler(self, handler: Callable[[Profile], Any], step_num: int) -> None:
        """on_trace_ready on the writer, with the profile as its window ended (its step number): the
        training thread goes on stepping meanwhile, so the handler gets a view, not a changed profile."""
        handler(_WindowView(self, step_num))  # type: ignore[arg-type]

    def _raise_handler_error(self, merge_only: bool = False) -> None:
        """Raise (once) what a finished background job raised: an on_trace_ready handler's exception, or
        a polyprof bug that cost the window its trace."""
        for job in self._jobs:
            if job.error is not None and (job.done.is_set() or (merge_only and job.merged.is_set())):
                error, job.error = job.error, None
                self._jobs = [j for j in self._jobs if j is not job]
                raise error

    def _abandon_sessions(self) -> None:
        if self._window is not None:
            self._window.abandon()
            self._window = None
        self.current_action = ProfilerAction.NONE

    @staticmethod
    def _problems(statuses: Iterable[BackendStatus]) -> list[str]:
        """One line per backend problem of a window (its trace's snapshot of each backend's status, so that
        the warning, the summary and the file say the same): errors, warnings, rejected and dropped rows."""
        out = []
        for st in statuses:
            problems = list(st.errors) + list(st.warnings)
            if st.rejected:
                problems.append(
                    f"{st.rejected} malformed rows rejected ({', '.join(f'{k}: {v}' for k, v in st.rejected_reasons.items())})"
                )
            problems += [f"dropped {n} {what}" for what, n in st.dropped.items() if not chosen_drop(what)]
            out += [f"polyprof backend {st.name!r}: {msg}" for msg in problems]
        return out

    def _emit_warnings(self) -> None:
        """Raise the background's findings as PolyprofWarnings on the calling (the user's) thread."""
        if writer.on_writer_thread:
            return
        while self._warnings:
            warn_user(self._warnings.pop(0))


class _WindowView:
    """The profile as an on_trace_ready handler sees it: everything is the profile's, except
    ``step_num``, which is the step its window ended at."""

    __slots__ = ("_profile", "step_num")

    def __init__(self, profile: Profile, step_num: int) -> None:
        object.__setattr__(self, "_profile", profile)
        object.__setattr__(self, "step_num", step_num)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._profile, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._profile, name, value)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - isinstance(view, type(profile)) holds, as for the profile
        return type(self._profile)

    def __repr__(self) -> str:
        return f"<{type(self._profile).__name__} at step {self.step_num}>"


def profile(activities: Iterable[Any] | None = None, **kwargs: Any) -> Profile:
    """Create a :class:`Profile` (use it as a context manager, or call start/stop)."""
    return Profile(activities, **kwargs)
