"""One profile across any number of backend sessions.

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
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson

from polyprof import annotations, correlation
from polyprof._version import __version__
from polyprof.backend import REQUIRED_SESSION_METHODS, Availability, ProfileConfig, SessionContext, Sink
from polyprof.clock import base_time_ns, epoch_offset, host_ns
from polyprof.engine.guard import describe, guarded_call
from polyprof.engine.merge import CollectedPart, merge
from polyprof.engine.schedule import (
    PREPARE,
    READY,
    START,
    STOP,
    TRANSITIONS,
    WARN,
    ProfilerAction,
    always_record,
)
from polyprof.errors import BackendUnavailableError, ConfigError, PolyprofError
from polyprof.model import BACKEND_FAILED, BACKEND_UNAVAILABLE, BackendStatus, Trace
from polyprof.registry import BackendEntry, Registry
from polyprof.registry import default as default_registry

DEFAULT_CALL_TIMEOUT_S = 30.0


class PolyprofWarning(UserWarning):
    """A backend problem that did not stop the profile (it is also recorded in the trace)."""


def activity_group_name(activity: Any) -> str:
    """'cpu', 'CPU', ProfilerActivity.CPU (polyprof's or torch's) -> 'CPU'."""
    if isinstance(activity, str):
        name = activity
    else:
        name = getattr(activity, "name", None)
        if not isinstance(name, str):
            raise ConfigError(
                f"activities must be names like 'cpu' or ProfilerActivity members, got {activity!r}"
            )
    name = name.strip()
    if not name:
        raise ConfigError("an empty activity name was given")
    return name.upper()


class _Selected:
    """A backend chosen for this profile, with what probing said."""

    __slots__ = ("entry", "availability")

    def __init__(self, entry: BackendEntry, availability: Availability) -> None:
        self.entry = entry
        self.availability = availability


class _SessionHandle:
    __slots__ = ("entry", "session", "ctx", "status", "started", "alive")

    def __init__(self, entry: BackendEntry, ctx: SessionContext, status: BackendStatus) -> None:
        self.entry = entry
        self.session: Any = None
        self.ctx = ctx
        self.status = status
        self.started = False
        self.alive = True


_active_lock = threading.Lock()


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


_active_profile: Profile | None = None


class Profile:
    """Runs one profile; see the module docstring. Arguments are checked here, before anything starts.

    Args:
        activities: activity groups ("cpu", "opencl", ...) or ProfilerActivity members. None: every
            group whose backend is available here. A group asked for explicitly whose backends are all
            unavailable raises BackendUnavailableError with their reasons.
        schedule: step -> ProfilerAction (see :func:`polyprof.schedule`); None records start to stop.
        on_trace_ready: called with this profile when a cycle's trace is ready.
        backend_options: ``{"opencl": {...}}``: options handed to each backend's sessions.
        call_timeout_s: a backend's stop/collect/close running longer is abandoned.
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
        if (
            isinstance(call_timeout_s, bool)
            or not isinstance(call_timeout_s, (int, float))
            or not math.isfinite(call_timeout_s)
            or call_timeout_s <= 0
        ):
            raise ConfigError(f"call_timeout_s must be a positive number of seconds, got {call_timeout_s!r}")
        if backend_options is not None and not isinstance(backend_options, Mapping):
            raise ConfigError("backend_options must map backend names to dicts of options")
        self.registry = registry or default_registry
        self.schedule = schedule or always_record
        self.record_steps = schedule is not None if record_steps is None else record_steps
        self.on_trace_ready = on_trace_ready
        self.call_timeout_s = float(call_timeout_s)
        self._metadata: dict[str, Any] = dict(metadata or {})
        self._explicit = activities is not None
        self._selected, self._unavailable, groups = self._select(activities)
        self.config = ProfileConfig(
            activities=frozenset(groups),
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            with_modules=with_modules,
            extra=dict(extra or {}),
        )
        self._kind_filters = self._kind_filters_of(activity_filters)
        self._paused: dict[str, list[tuple[int, int]]] = {}  # backend -> [start, end) collection off
        self._paused_since: dict[str, int] = {}
        self.window_observers = list(window_observers)
        self._backend_options = {k: dict(v) for k, v in (backend_options or {}).items()}
        selected_names = {s.entry.name for s in self._selected}
        for name in self._backend_options:
            if name not in selected_names:
                from polyprof.errors import UnknownNameError

                raise UnknownNameError(
                    "backend",
                    name,
                    selected_names,
                    " (backend_options names a backend this profile does not use)",
                )
        for sel in self._selected:
            checker = getattr(sel.entry.backend, "check_options", None)
            if checker is not None:
                try:
                    checker(self._backend_options.get(sel.entry.name, {}))
                except ConfigError:
                    raise
                except Exception as exc:
                    raise ConfigError(f"backend {sel.entry.name!r} rejected its options: {exc}") from exc

        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self._postprocess_ms: dict[str, Any] = {}
        self._handles: list[_SessionHandle] = []
        self._recording = False
        self._window_start = 0
        self._trace: Trace | None = None
        self._step_span: annotations.record_function | None = None
        self._started = False

    # -- selection ----------------------------------------------------------------------------------
    def _select(self, activities: Iterable[Any] | None) -> tuple[list[_Selected], list[_Selected], list[str]]:
        selected: list[_Selected] = []
        unavailable: list[_Selected] = []
        if activities is None:
            seen: set[str] = set()
            groups: set[str] = set()
            for entry in self.registry.entries():
                if entry.broken or entry.name in seen:
                    continue
                seen.add(entry.name)
                avail = self.registry.probe(entry)
                (selected if avail.available else unavailable).append(_Selected(entry, avail))
                if avail.available:
                    groups |= {a.upper() for a in entry.activities}
            return selected, unavailable, sorted(groups)
        if isinstance(activities, (str, bytes)):
            activities = [activities]
        groups_list = [activity_group_name(a) for a in activities]
        if len(set(groups_list)) != len(groups_list):
            raise ConfigError(f"an activity group is listed twice: {groups_list}")
        by_group = self.registry.for_activities(groups_list)
        chosen: dict[str, _Selected] = {}
        for group, entries in by_group.items():
            results = []
            for entry in entries:
                if entry.name not in chosen:
                    chosen[entry.name] = _Selected(entry, self.registry.probe(entry))
                results.append(chosen[entry.name])
            if not any(r.availability.available for r in results):
                reasons = "; ".join(f"{r.entry.name}: {r.availability.reason}" for r in results)
                raise BackendUnavailableError(f"activity {group} cannot be profiled here: {reasons}")
        for sel in chosen.values():
            (selected if sel.availability.available else unavailable).append(sel)
        return selected, unavailable, groups_list

    def _kind_filters_of(self, activity_filters: Mapping[str, Iterable[int]] | None) -> dict[str, set[int]]:
        """Backend name -> the kinds kept of its rows, from group -> kinds filters."""
        if not activity_filters:
            return {}
        by_group = {activity_group_name(g): {int(k) for k in kinds} for g, kinds in activity_filters.items()}
        out: dict[str, set[int]] = {}
        for sel in self._selected:
            groups = [g for g in (a.upper() for a in sel.entry.activities) if g in by_group]
            if groups:
                out[sel.entry.name] = set().union(*(by_group[g] for g in groups))
        return out

    def toggle_collection_dynamic(self, enable: bool, activities: Iterable[Any]) -> None:
        """Stop (``enable=False``) or resume collecting the given activity groups inside a recording
        window, as torch.profiler's method does: what those groups' backends record in between is left
        out of the trace (counted under ``dropped``)."""
        groups = {activity_group_name(a) for a in activities}
        now = host_ns()
        for sel in self._selected:
            name = sel.entry.name
            if not groups & {a.upper() for a in sel.entry.activities}:
                continue
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

    @property
    def backends(self) -> list[str]:
        """Names of the backends this profile runs."""
        return [s.entry.name for s in self._selected]

    # -- the user API --------------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Begin: apply the schedule's action for step 0."""
        if self._started:
            raise PolyprofError("this profile is already started; call stop() before starting it again")
        self._started = True
        self._profile_hooks("profile_started", self.config)
        try:
            self._transition(ProfilerAction.NONE, self.schedule(self.step_num))
        except BaseException:
            self._abandon_sessions()  # e.g. another profile is recording: release what prepare set up
            self._profile_hooks("profile_stopped")
            self._started = False
            raise
        self._enter_step_span()

    def step(self) -> None:
        """Mark the end of a step: advance `step_num` and apply the schedule's transition."""
        if not self._started:
            raise PolyprofError("step() called before start()")
        self._exit_step_span()
        prev = self.current_action
        self.step_num += 1
        self._transition(prev, self.schedule(self.step_num))
        self._enter_step_span()

    def stop(self) -> None:
        """End: finish the current cycle (recording cycles are collected and handed to on_trace_ready)."""
        if not self._started:
            return
        self._exit_step_span()
        try:
            self._apply(TRANSITIONS[(self.current_action, None)])
        finally:
            self.current_action = ProfilerAction.NONE
            self._started = False
            self._profile_hooks("profile_stopped")

    def _profile_hooks(self, hook: str, *args: Any) -> None:
        """A backend's optional ``profile_started(config)`` / ``profile_stopped()``: the whole profile,
        every step of a schedule (OpenCL makes queues created at any step profiling-enabled). A failure
        is a warning naming the backend, never the user's exception."""
        for sel in self._selected:
            fn = getattr(sel.entry.backend, hook, None)
            if not callable(fn):
                continue
            try:
                fn(*args)
            except Exception as exc:
                warnings.warn(
                    f"polyprof backend {sel.entry.name!r}: {hook}() raised {describe(exc)}",
                    PolyprofWarning,
                    stacklevel=4,
                )

    @property
    def trace(self) -> Trace:
        """The last trace collected. Raises if nothing has been recorded yet."""
        if self._trace is None:
            raise PolyprofError(
                "no trace has been recorded yet: profile something first (start/stop or a with block)"
            )
        return self._trace

    def export_chrome_trace(self, path: str) -> str:
        """Write the last trace as Kineto-dialect Chrome JSON (gzip when `path` ends in .gz)."""
        from polyprof.export.chrome import write_chrome_trace

        return write_chrome_trace(self.trace, path)

    def add_metadata(self, key: str, value: Any) -> None:
        """A top-level key/value of the trace (value must be JSON-serialisable)."""
        self._metadata[str(key)] = value
        if self._trace is not None:
            self._trace.metadata[str(key)] = value

    def add_metadata_json(self, key: str, value: str) -> None:
        """Like add_metadata, with `value` already JSON text."""
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"add_metadata_json({key!r}): value is not valid JSON: {exc}") from exc
        self.add_metadata(key, parsed)

    # -- schedule machinery --------------------------------------------------------------------------
    def _transition(self, prev: ProfilerAction, cur: Any) -> None:
        if not isinstance(cur, ProfilerAction):
            cur = ProfilerAction(getattr(cur, "value", cur))
        if cur is ProfilerAction.DEVICE_STOPPED:
            raise ConfigError(
                "ProfilerAction.DEVICE_STOPPED is set internally by the profiler and must not be returned by "
                "a user-provided schedule"
            )
        self._apply(TRANSITIONS[(prev, cur)])
        self.current_action = cur

    def _apply(self, phases: tuple[str, ...]) -> None:
        for phase in phases:
            if phase == PREPARE:
                self._prepare()
            elif phase == START:
                self._start_recording()
            elif phase == STOP:
                self._stop_recording()
            elif phase == READY:
                if self.on_trace_ready is not None:
                    self.on_trace_ready(self)
            elif phase == WARN:
                warnings.warn(
                    "Incorrect schedule: WARMUP followed by NONE or RECORD followed by NONE/WARMUP; "
                    "the trace of this cycle is not saved",
                    stacklevel=4,
                )

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
        if self._handles:
            return
        for sel in self._selected:
            entry = sel.entry
            status = BackendStatus(
                entry.name, version=entry.version or str(sel.availability.versions.get("version", ""))
            )
            ctx = SessionContext(entry.name, self._backend_options.get(entry.name))
            handle = _SessionHandle(entry, ctx, status)
            outcome = guarded_call(status, "create_session", entry.backend.create_session, self.config, ctx)
            if outcome.ok:
                missing = [
                    m for m in REQUIRED_SESSION_METHODS if not callable(getattr(outcome.value, m, None))
                ]
                if missing:
                    status.errors.append(f"create_session() returned a session without {', '.join(missing)}")
                else:
                    handle.session = outcome.value
            handle.alive = handle.session is not None
            if handle.alive and not guarded_call(status, "prepare", handle.session.prepare).ok:
                self._close(handle)
            self._handles.append(handle)

    def _start_recording(self) -> None:
        global _active_profile
        with _active_lock:
            if _active_profile is not None and _active_profile is not self:
                raise PolyprofError(
                    "another polyprof profile is already recording in this process; stop it first"
                )
            _active_profile = self
        self._epoch = epoch_offset()
        self._window_observers("start")
        self._window_start = host_ns()
        targets = []
        for h in self._live():
            h.ctx.window_start = self._window_start
            if guarded_call(h.status, "start", h.session.start).ok:
                h.started = True
                push = getattr(h.session, "push_correlation", None)
                pop = getattr(h.session, "pop_correlation", None)
                if callable(push) and callable(pop):
                    targets.append(correlation.CorrelationTarget(push, pop, self._correlation_failed(h)))
            else:
                self._close(h)
        correlation.set_targets(tuple(targets))
        self._recording = True

    def _correlation_failed(self, handle: _SessionHandle) -> Callable:
        def on_error(target: correlation.CorrelationTarget, exc: BaseException) -> None:
            handle.status.errors.append(f"push/pop_correlation raised {describe(exc)}; correlation disabled")
            correlation.set_targets(tuple(t for t in correlation.targets if t is not target))

        return on_error

    def _window_observers(self, call: str) -> None:
        for obs in self.window_observers:
            try:
                getattr(obs, call)()
            except Exception as exc:  # an observer's failure is the user's to see, never a lost trace
                warnings.warn(
                    f"polyprof: {type(obs).__name__}.{call}() raised {describe(exc)}", PolyprofWarning, stacklevel=5
                )

    def _stop_recording(self) -> None:
        global _active_profile
        self._window_observers("stop")
        window_end = host_ns()
        correlation.set_targets(())
        parts: list[CollectedPart] = []
        self._postprocess_ms = {}
        for h in self._handles:
            h.ctx.window_end = window_end
        # last started, first stopped: a backend started inside another's session (polyprof's CUDA
        # tracing inside torch's collector, which takes CUPTI) stops while the outer one still runs
        for h in reversed(self._handles):
            if h.alive and h.started:
                with self._timed(h.entry.name, "stop"):
                    timed_out = self._call(h, "stop", h.session.stop).timed_out
                if timed_out:
                    h.status.state = BACKEND_FAILED  # abandoned: nothing of it can be collected
        with gc_paused():  # collect builds many containers and no cycles: collecting them is wasted work
            self._collect_all(parts)
        for sel in self._unavailable:
            st = BackendStatus(
                sel.entry.name, BACKEND_UNAVAILABLE, reason=sel.availability.reason, version=sel.entry.version
            )
            parts.append(CollectedPart(st, Sink(sel.entry.name)))
        self._handles = []
        self._recording = False
        with _active_lock:
            _active_profile = None
        for p in parts:
            if p.sink.rejected:
                p.status.rejected = sum(p.sink.rejected.values())
                p.status.rejected_reasons = dict(p.sink.rejected)
        epoch = self._epoch
        meta = {
            **self._metadata,
            "polyprof": {
                "version": __version__,
                "activities": sorted(self.config.activities),
                "clock": {
                    "host": "perf_counter_ns",
                    "epoch_offset_ns": epoch.offset_ns,
                    "epoch_uncertainty_ns": epoch.uncertainty_ns,
                },
            },
        }
        merge_started = time.perf_counter()
        self._trace = merge(
            parts,
            window=(self._window_start, window_end),
            epoch_offset_ns=epoch.offset_ns,
            base_time_ns=base_time_ns(self._window_start + epoch.offset_ns),
            metadata=meta,
            kind_filters=self._kind_filters,
            paused=self._take_paused(window_end),
        )
        self._postprocess_ms["merge"] = round((time.perf_counter() - merge_started) * 1e3, 3)
        # where the time between stop and a trace went: each backend's stop and collect, then merge
        self._trace.metadata["polyprof"]["postprocess_ms"] = self._postprocess_ms
        # merge() fills in each backend's activity and out-of-window counts, so serialise after it
        self._trace.metadata["polyprof"]["backends"] = {p.status.name: p.status.to_json() for p in parts}
        self._warn_user(parts)

    def _collect_all(self, parts: list[CollectedPart]) -> None:
        for h in self._handles:
            sink = Sink(h.entry.name)
            if h.alive and h.started:
                with self._timed(h.entry.name, "collect"):
                    outcome = self._call(h, "collect", h.session.collect, sink)
                if not outcome.ok:
                    # rows a failed collect emitted before raising are kept; a hung one's are not,
                    # since its thread may still be writing
                    h.status.state = BACKEND_FAILED
                if outcome.timed_out:
                    sink.closed = True
                    sink = Sink(h.entry.name)
            self._close(h)
            self._finish_status(h)
            parts.append(CollectedPart(h.status, sink))

    def _call(self, h: _SessionHandle, what: str, fn: Callable, *args: Any) -> Any:
        timeout = None if getattr(h.session, "thread_affine", False) else self.call_timeout_s
        outcome = guarded_call(h.status, what, fn, *args, timeout_s=timeout)
        if outcome.timed_out:
            h.alive = False
        return outcome

    @contextlib.contextmanager
    def _timed(self, backend: str, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            took = round((time.perf_counter() - started) * 1e3, 3)
            self._postprocess_ms.setdefault(backend, {})[phase] = took

    def _abandon_sessions(self) -> None:
        for h in self._handles:
            if h.alive and h.started:
                self._call(h, "stop", h.session.stop)
            self._close(h)
        self._handles = []
        self.current_action = ProfilerAction.NONE

    def _close(self, h: _SessionHandle) -> None:
        if h.session is not None and h.alive:
            self._call(h, "close", h.session.close)
        h.alive = False

    def _live(self) -> list[_SessionHandle]:
        return [h for h in self._handles if h.alive and h.session is not None]

    @staticmethod
    def _finish_status(h: _SessionHandle) -> None:
        st, rep = h.status, h.ctx.report
        st.errors.extend(rep.errors)
        st.warnings.extend(w for w in rep.warnings if w not in st.warnings)
        for what, n in rep.dropped.items():
            st.dropped[what] = st.dropped.get(what, 0) + n
        st.clock.update(rep.clock)
        st.details.update(rep.details)
        st.attachments.update(rep.attachments)
        if h.session is None or not h.started:
            st.state = BACKEND_FAILED

    @staticmethod
    def _warn_user(parts: list[CollectedPart]) -> None:
        for p in parts:
            st = p.status
            problems = list(st.errors) + list(st.warnings)
            if st.rejected:
                problems.append(
                    f"{st.rejected} malformed rows rejected ({', '.join(f'{k}: {v}' for k, v in st.rejected_reasons.items())})"
                )
            for what, n in st.dropped.items():
                if what not in ("outside capture window", "activity filter", "collection toggled off"):
                    problems.append(f"dropped {n} {what}")
            for msg in problems:
                warnings.warn(f"polyprof backend {st.name!r}: {msg}", PolyprofWarning, stacklevel=5)


def profile(activities: Iterable[Any] | None = None, **kwargs: Any) -> Profile:
    """Create a :class:`Profile` (use it as a context manager, or call start/stop)."""
    return Profile(activities, **kwargs)
