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

import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from polyprof.engine import exclusive
from polyprof.engine.background import Job, WindowJobs, run_here, writer
from polyprof.engine.listeners import listeners_for
from polyprof.engine.pauses import Pauses
from polyprof.engine.profile_options import ProfileOptions
from polyprof.engine.registry import default as default_registry
from polyprof.engine.schedule import (
    PREPARE,
    READY,
    START,
    STOP,
    WARN,
    ProfilerAction,
    always_record,
    phases_between,
)
from polyprof.engine.selection import (
    activity_group_name,
    check_backend_options,
    kind_filters,
    select_backends,
)
from polyprof.engine.signals import CleanStop
from polyprof.engine.step_spans import StepSpans
from polyprof.engine.window import Window, call_observers, status_problems, trace_metadata
from polyprof.engine.window_view import WindowView
from polyprof.errors import ConfigError, PolyprofError, warn_user
from polyprof.model import Trace
from polyprof.plugin.clock import host_ns


class Profile:
    """Runs one profile; see the module docstring. `activities`: activity groups ("cpu", "opencl", ...)
    or ProfilerActivity members; None: every group whose backend is available here (a group asked for
    explicitly whose backends are all unavailable raises BackendUnavailableError with their reasons).
    The other keywords, or ``options=``, are :class:`polyprof.ProfileOptions`'s, checked before
    anything starts."""

    def __init__(self, activities: Iterable[Any] | None = None, *, options: ProfileOptions | None = None,
                 **keywords: Any) -> None:
        self.options = options = ProfileOptions.of(options, keywords)
        self._signals = CleanStop() if options.handle_signals else None
        #: the spill and the ring: what a window tells besides its recording (engine/listeners.py)
        self._listeners = listeners_for(options.spill, options.ring_s, self._spill_header, warn_user, options.ring_mb)
        self.registry = options.registry or default_registry
        self.schedule = options.schedule or always_record
        self.record_steps = options.schedule is not None if options.record_steps is None else options.record_steps
        self._step_spans = StepSpans()
        self.on_trace_ready = options.on_trace_ready
        self._metadata: dict[str, Any] = dict(options.metadata)
        self._selection = select_backends(self.registry, activities)
        self.config = options.config(self._selection.groups)
        self._selection.warn_left_out()
        self._kind_filters = kind_filters(self._selection, options.activity_filters)
        self._backend_options = check_backend_options(self._selection, options.backend_options)
        self._pauses = Pauses()
        self.window_observers = list(options.window_observers)
        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self._window: Window | None = None  # this cycle's window, from its warm-up to its end
        self._trace: Trace | None = None
        self._jobs = WindowJobs()  # this profile's windows still in the background
        self._abandoned: dict[str, str] = {}  # backends whose call hung: no session in later windows
        self._started = False
        self._merge_here = self._discard = False
        #: called (on the thread that starts it) with another profile about to record while this one
        #: records; it must stop this one. None: the other profile's start is refused with an error.
        self.yield_to: Callable[[Profile], None] | None = None

    @property
    def _recording(self) -> bool:
        return self._window is not None and self._window.recording

    @property
    def spill_path(self) -> str | None:
        """The spill file (an absolute path), or None."""
        return self.options.spill

    @property
    def backends(self) -> list[str]:
        """Names of the backends this profile runs."""
        return self._selection.names

    def toggle_collection_dynamic(self, enable: bool, activities: Iterable[Any]) -> None:
        """Stop (``enable=False``) or resume collecting `activities`' groups in a recording window, as
        torch.profiler does: their backends' rows in between are left out (counted under ``dropped``)."""
        groups = {activity_group_name(a) for a in activities}
        self._pauses.toggle([chosen.name for chosen in self._selection.serving(groups)], enable, host_ns())

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
        self._jobs.raise_error()
        self._step_spans.exit()
        prev = self.current_action
        self.step_num += 1
        self._transition(prev, self.schedule(self.step_num))
        self._enter_step_span()

    def stop(self, wait: bool = True, discard: bool = False) -> None:
        """End: finish the current cycle. With `wait` (the default) returns once every window's trace is
        merged and its on_trace_ready handler has run; with ``wait=False`` once the recorders are stopped
        (``prof.trace`` then waits); with `discard`, the last window's rows are let go, unmerged."""
        if not self._started:
            return
        self._discard = discard
        self._step_spans.exit()
        try:
            self._end(self.current_action, wait)
        finally:
            self.current_action, self._discard = ProfilerAction.NONE, False

    # -- the lifecycle's parts, shared with front ends that drive the transitions themselves -----------
    def _begin(self, prev: Any, cur: Any) -> None:
        """The profile starts with the transition `prev` -> `cur`; a failure releases what was set up."""
        self._started = True
        if self._signals is not None:
            self._signals.__enter__()
        self._selection.call_hooks("profile_started", self.config)
        try:
            self._transition(prev, cur)
        except BaseException:
            self._abandon_sessions()  # e.g. another profile is recording: release what prepare set up
            self._selection.call_hooks("profile_stopped")
            self._started = False
            raise

    def _between_steps(self) -> None:
        """At a step boundary, before its transition: the background's warnings reach the caller."""
        self._jobs.emit_warnings(warn_user)

    def _end(self, prev: Any, wait: bool = True) -> None:
        """The profile ends from action `prev`: the last window's phases, then (with `wait`) its trace
        and handler, the spill closed, warnings and a handler's error raised."""
        self._merge_here = wait  # the caller waits anyway: merge on its thread, without a hand-over
        try:
            self._transition(prev, None)
        finally:
            self._merge_here = False
            self._started = False
            self._selection.call_hooks("profile_stopped")
        if wait:
            self._jobs.wait_done()
        self.close_spill(remove=False)  # the profile ended: the spill says so, and stays until a trace is written
        if self._signals is not None:
            self._signals.__exit__()  # the program's own handlers are back (a noted signal is ended in __exit__)
        self._jobs.emit_warnings(warn_user)
        self._jobs.raise_error()

    def _ending_with_signals(self, end: Callable[[], Any]) -> None:  # (handle_signals: CleanStop.end_with)
        end() if self._signals is None else self._signals.end_with(end)

    @property
    def trace(self) -> Trace:
        """The last trace collected (waiting for it when its window's merge is still running). Raises if
        nothing has been recorded yet."""
        self._wait_for_trace()
        if self._trace is None:
            raise PolyprofError("no trace has been recorded yet: profile something first (start/stop or a with block)")
        return self._trace

    def _wait_for_trace(self) -> None:
        self._jobs.wait_merged()
        self._jobs.emit_warnings(warn_user)
        self._jobs.raise_error(merge_only=True)

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

    def dump(self, path: str, *, last_s: float | None = None, metadata: Mapping[str, Any] | None = None) -> str:
        """Write what the current window has recorded so far (its last `last_s` seconds where given),
        while it goes on recording (for a job that hangs: its state without stopping it), with
        `metadata` added to this trace's. Backends that hand over rows while recording (``flush``) are
        in it; the others only come at the window's end (the trace's ``polyprof.partial`` lists them).
        Returns the path written. Safe on another thread than the training one."""
        from polyprof.formats.files import write_trace

        window = self._window
        if window is None or not window.recording:
            raise PolyprofError("dump() needs a recording window: nothing is being recorded now")
        trace = window.dump({**self._window_metadata(), **(metadata or {})}, self.config.activities,
                            self.options.limits, last_s)
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

    # -- schedule machinery --------------------------------------------------------------------------
    def _transition(self, prev: Any, cur: Any) -> None:
        """The schedule's move from action `prev` to `cur` (None: the profile ends)."""
        cur, phases, transition = phases_between(prev, cur)
        for phase in phases:
            if phase == PREPARE:
                self._prepare()
            elif phase == START:
                self._start_recording()
            elif phase == STOP:
                self._stop_recording(save=READY in phases)
            elif phase == WARN:  # torch's words (this cycle's trace is not saved)
                warn_user(f"Incorrect schedule: {transition}", UserWarning)
        self.current_action = cur

    def _enter_step_span(self) -> None:
        if self.record_steps and self._recording:
            self._step_spans.enter(self.step_num)

    # -- lifecycle phases ----------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._window is not None:
            return
        self._window = Window.prepared(self._selection, self.config, self._backend_options, self.options.call_timeout_s,
                                       self._abandoned)

    def _start_recording(self) -> None:
        try:
            exclusive.claim(self)
        except BaseException:  # another profile records: this one's window never starts, and is let go
            self._abandon_sessions()
            raise
        window = self._window
        assert window is not None
        # a backend's recorder may be process-wide (torch's observer): the last window's collect must
        # be done with it before it records again (a warm-up step in between hides the wait)
        self._jobs.wait_collected()
        window.read_epoch()
        call_observers(self.window_observers, "start")
        window.start(self.step_num, self.options.flush_every_s, self._listeners)

    def _spill_header(self) -> dict[str, Any]:
        epoch = self._window.epoch if self._window is not None else None
        return {"activities": sorted(self.config.activities), "epoch_offset_ns": epoch.offset_ns if epoch else 0,
                "flush_interval_s": self.options.flush_every_s, "metadata": self._window_metadata()}

    def close_spill(self, remove: bool = True) -> None:
        """End the spill cleanly; with `remove` (a trace has been written), delete it."""
        for listener in self._listeners:
            listener.close(remove)

    def _stop_recording(self, save: bool = True) -> None:
        """The training thread's part of a window's end: stop the recorders, hand the rest over."""
        if self._window is None:  # its start was refused (another profile records): nothing to stop
            return
        called = time.perf_counter()
        call_observers(self.window_observers, "stop")
        ending, self._window = self._window, None
        window_end = ending.stop(self.options.ring_s)
        self._abandoned.update(ending.sessions.abandoned())  # a stop that hung: no session next window
        exclusive.release(self)
        if self._discard:
            ending.abandon()
            exclusive.free()
            return
        meta = trace_metadata(self._window_metadata(), self.config.activities, ending.epoch)
        paused = self._pauses.take(window_end)
        step_num = self.step_num
        handler = self.on_trace_ready if save else None

        def run(job: Job) -> Trace:
            trace = ending.finish(meta, self.options.call_timeout_s, on_collected=job.collected.set, paused=paused,
                                  kind_filters=self._kind_filters, limits=self.options.limits, warnings=self._jobs.warnings)
            self._abandoned.update(ending.sessions.abandoned())
            trace.timings_ms["window_end_call"] = blocked_ms
            self._jobs.warnings.extend(status_problems(trace.backends.values()))
            self._on_trace(trace)
            self._trace = trace
            job.merged.set()
            if handler is not None:  # with the profile as its window ended: the training thread goes on
                handler(WindowView(self, step_num))
            return trace

        here = writer.on_writer_thread or (self._merge_here and not self._jobs.busy)
        if here:  # stop() that waits anyway, or a window ended from inside a handler: run it here
            blocked_ms = round((time.perf_counter() - called) * 1e3, 3)
            self._jobs.add(run_here(run))
        else:
            self._jobs.add(writer.submit(run))
            blocked_ms = round((time.perf_counter() - called) * 1e3, 3)
        exclusive.free()  # (after the job is known: a profile that yielded waits for its hand-over first)

    def wait_collected(self) -> None:
        """Until the last window's backends have handed over what they recorded."""
        self._jobs.wait_collected()

    def _abandon_sessions(self) -> None:
        if self._window is not None:
            self._window.abandon()
            self._window = None
        self.current_action = ProfilerAction.NONE



Profile.__init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("activities", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("options", inspect.Parameter.KEYWORD_ONLY, default=None),
        *(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
            for f in ProfileOptions.__dataclass_fields__.values()
        ),
    ]
)  # help(polyprof.profile) lists every keyword ProfileOptions takes


def profile(activities: Iterable[Any] | None = None, **kwargs: Any) -> Profile:
    """Create a :class:`Profile` (use it as a context manager, or call start/stop)."""
    return Profile(activities, **kwargs)
