"""What a profile is asked to do, in one checked object shared by both front ends: polyprof's own
``polyprof.profile(...)`` and the torch.profiler-compatible ``polyprof.profiler.profile(...)`` take these
keywords (or ``options=``), and the engine reads them from here only.

::

    options = ProfileOptions(ring_s=30, spill="run.spill", limits={"min_host_span_ns": 5000})
    with polyprof.profile(["cpu", "opencl"], options=options) as prof: ...
    with polyprof.profile(["cpu"], ring_s=30) as prof: ...              # the same, as keywords

Every value is checked when the object is made, before anything starts; a wrong one raises
ConfigError naming the keyword and what it takes. ``ProfileOptions.of(options, keywords)`` merges an
options object with keywords given beside it (a keyword wins) and names an unknown keyword.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from polyprof.engine.sessions import DEFAULT_CALL_TIMEOUT_S, DEFAULT_FLUSH_INTERVAL_S
from polyprof.errors import ConfigError
from polyprof.merge.limits import Limits
from polyprof.plugin.backend import ProfileConfig

#: with a spill, completed rows are handed over (and spilled) this often unless asked otherwise
SPILL_FLUSH_INTERVAL_S = 1.0


def _positive(name: str, value: Any, allow_none: bool = False, unit: str = "seconds") -> float | None:
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{name} must be a positive number of {unit}, got {value!r}")
    return float(value)


def _callable(name: str, value: Any, what: str) -> None:
    if value is not None and not callable(value):
        raise ConfigError(f"{name} must be {what}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """The keywords of a profile. Frozen: a profile's options do not change under it;
    ``dataclasses.replace`` makes a changed copy.

    Args:
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
        ring_mb: with `ring_s`, the rows the ring holds are also kept under about this many megabytes
            and the last hand-over's rows (the oldest let go first, counted under ``dropped``); None: no cap.
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
        registry: where backends are looked up (default: the process's, entry points included).
        record_steps: a ``ProfilerStep#N`` span per step (default: with a schedule).
        record_shapes, profile_memory, with_stack, with_flops, with_modules: torch.profiler's, handed to
            backends in ``ProfileConfig``.
    """

    schedule: Callable[[int], Any] | None = None
    on_trace_ready: Callable[[Any], Any] | None = None
    backend_options: Mapping[str, Mapping[str, Any]] | None = None
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    flush_interval_s: float | None = DEFAULT_FLUSH_INTERVAL_S
    spill: str | os.PathLike | None = None
    ring_s: float | None = None
    ring_mb: float | None = None
    limits: Any = None
    handle_signals: bool = False
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    metadata: Mapping[str, Any] | None = None
    registry: Any = None
    record_steps: bool | None = None
    activity_filters: Mapping[str, Iterable[int]] | None = None
    window_observers: Iterable[Any] = ()
    extra: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        _callable("schedule", self.schedule, "a callable step -> ProfilerAction (see polyprof.schedule)")
        _callable("on_trace_ready", self.on_trace_ready, "callable")
        put = object.__setattr__  # checked values in their one form (each conversion is idempotent)
        put(self, "call_timeout_s", _positive("call_timeout_s", self.call_timeout_s))
        put(self, "ring_s", _positive("ring_s", self.ring_s, allow_none=True))
        put(self, "ring_mb", _positive("ring_mb", self.ring_mb, allow_none=True, unit="megabytes"))
        put(self, "flush_interval_s", _positive("flush_interval_s", self.flush_interval_s, allow_none=True))
        if self.spill is not None:
            put(self, "spill", os.path.abspath(os.fspath(self.spill)))
        put(self, "limits", Limits.of(self.limits))
        put(self, "metadata", dict(self.metadata or {}))
        put(self, "window_observers", tuple(self.window_observers))
        put(self, "extra", dict(self.extra or {}))

    @property
    def flush_every_s(self) -> float | None:
        """How often sessions hand rows over while recording: `flush_interval_s`, 1 s with a spill
        unless it was set, and at least four times per `ring_s` so that rows age out of the ring."""
        flush = self.flush_interval_s
        if self.spill is not None and flush == DEFAULT_FLUSH_INTERVAL_S:
            flush = SPILL_FLUSH_INTERVAL_S
        if self.ring_s is not None:
            flush = min(flush or self.ring_s, self.ring_s / 4)
        return flush

    def config(self, groups: Iterable[str]) -> ProfileConfig:
        """What every backend's session is told of the profile (its activity groups and these flags)."""
        return ProfileConfig(
            activities=frozenset(groups),
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
            extra=dict(self.extra),
        )

    @classmethod
    def of(cls, options: ProfileOptions | None, keywords: Mapping[str, Any]) -> ProfileOptions:
        """`options` (or the defaults) with `keywords` laid over it; an unknown keyword is a TypeError
        that names it and the keywords there are, as Python's own for a function."""
        unknown = sorted(set(keywords) - cls.names())
        if unknown:
            raise TypeError(
                f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; a profile takes: "
                f"{', '.join(sorted(cls.names()))}"
            )
        if options is not None and not isinstance(options, cls):
            raise ConfigError(f"options must be a polyprof.ProfileOptions, got {type(options).__name__}")
        if options is None:
            return cls(**keywords)
        return dataclasses.replace(options, **keywords) if keywords else options

    @classmethod
    def names(cls) -> frozenset[str]:
        """The keywords a profile takes."""
        return frozenset(f.name for f in dataclasses.fields(cls))
