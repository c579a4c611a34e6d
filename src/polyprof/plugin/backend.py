"""The backend contract, version 1: what a device or host backend implements, and what it is given.

A backend is any object with::

    name: str                      # short and unique: "cuda", "opencl", "host"
    api_version: int               # polyprof.plugin.backend.API_VERSION
    activities: frozenset[str]     # activity groups it serves: {"OPENCL"}, {"CPU"}, ...
    def probe(self) -> Availability: ...            # cheap, no side effects
    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Session: ...

and optionally ``options`` (an :class:`~polyprof.plugin.options.OptionSchema` the engine checks),
``check_options(options)``, and ``traits`` (:class:`~polyprof.plugin.traits.BackendTraits`: ``on_by_default=False``
for a backend that costs enough to run only when its group is asked for by name, the facilities it
takes, ...). A session has ``prepare()``, ``start()``, ``stop()``, ``collect(sink)``,
``close()`` (:class:`SessionBase` gives no-op ``prepare``/``close``) and, optionally, ``flush(sink)``
(hand over completed rows while recording, from a background thread) and, if its device work can be
attributed to host operations by the vendor library, ``push_correlation(id, kind)`` and
``pop_correlation(kind)``. A session whose ``stop`` must run on the thread that started the profile
declares ``traits = SessionTraits(thread_affine=True)`` (it then gets no time limit on that call).

Plugin authors import everything from one module, :mod:`polyprof.plugin`;
``docs/writing-a-backend.md`` walks through a complete backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from polyprof.model import BackendStatus
from polyprof.plugin import correlation, facilities
from polyprof.plugin.clock import ClockMapping, host_ns

BY_OPTION = "by option: "  # how the drops a user's options asked for are named in a backend's status

if TYPE_CHECKING:
    from polyprof.plugin.sink import Sink

API_VERSION = 1
REQUIRED_BACKEND_ATTRIBUTES = ("name", "api_version", "activities", "probe", "create_session")
REQUIRED_SESSION_METHODS = ("prepare", "start", "stop", "collect", "close")
#: What a session may implement besides: hand over completed rows while recording (called from a
#: background thread), and push/pop correlation ids of host operations to a vendor library.
OPTIONAL_SESSION_METHODS = ("flush", "push_correlation", "pop_correlation")


@dataclass(frozen=True)
class Availability:
    """A backend's answer to "can you run here?", with a reason a user can act on when not."""

    available: bool
    reason: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    devices: Sequence[str] = ()

    @classmethod
    def yes(cls, devices: Sequence[str] = (), **versions: str) -> Availability:
        return cls(True, "", dict(versions), tuple(devices))

    @classmethod
    def no(cls, reason: str, **versions: str) -> Availability:
        return cls(False, reason, dict(versions), ())


@dataclass(frozen=True)
class ProfileConfig:
    """What the user asked of the whole profile; every session sees the same one."""

    activities: frozenset[str] = frozenset()
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    #: front-end specific settings, e.g. torch's ``torch_experimental_config`` object and the
    #: ``capture_overload_names`` / ``profile_all_threads`` / ``record_python_gc_info`` flags
    extra: Mapping[str, Any] = field(default_factory=dict)


class Reporter:
    """Where a session reports warnings, errors, dropped records, clock fits and details. It writes
    straight into the backend's :class:`~polyprof.model.BackendStatus` (one object per backend and
    profile), which the trace keeps and the writer serialises."""

    __slots__ = ("status",)

    def __init__(self, status: BackendStatus | None = None) -> None:
        self.status = status if status is not None else BackendStatus("")

    def attach(self, key: str, value: Any) -> None:
        """An in-memory object for the front ends (e.g. torch's own profiler result), kept on the trace
        (``trace.attachments``) but never written to a file."""
        self.status.attachments[key] = value

    def detail(self, key: str, value: Any) -> None:
        """A fact about how the backend recorded (JSON-serialisable), e.g. which recorder it used."""
        self.status.details[key] = value

    def warning(self, message: str) -> None:
        if message not in self.status.warnings:
            self.status.warnings.append(message)

    def error(self, message: str) -> None:
        self.status.errors.append(message)

    def dropped_records(self, count: int, what: str = "records") -> None:
        self.status.add_dropped(what, count)

    def filtered_records(self, count: int, what: str) -> None:
        """Rows left out because the backend's options asked for it: counted, never warned about."""
        self.status.add_dropped(BY_OPTION + what, count)

    def clock_mapping(self, mapping: ClockMapping, device: str = "") -> None:
        """Record how a device clock was mapped to the host clock (and how far off it may be)."""
        self.status.clock[device or "device"] = mapping.to_json()

    def clock_offset(self, name: str, measurement: dict[str, Any]) -> None:
        """Record a clock measured against another (``"to rank 0"``: this rank's epoch against rank 0's)."""
        self.status.clock[name] = dict(measurement)

    # read access, for sessions and tests
    @property
    def errors(self) -> list[str]:
        return self.status.errors

    @property
    def warnings(self) -> list[str]:
        return self.status.warnings

    @property
    def dropped(self) -> dict[str, int]:
        return self.status.dropped

    @property
    def clock(self) -> dict[str, Any]:
        return self.status.clock

    @property
    def details(self) -> dict[str, Any]:
        return self.status.details


class SessionContext:
    """What the engine gives a session: clock, ids, capture window, options, reporter."""

    def __init__(
        self, backend_name: str, options: Mapping[str, Any] | None = None, status: BackendStatus | None = None
    ) -> None:
        self.backend_name = backend_name
        self.options: Mapping[str, Any] = dict(options or {})
        self.status = status if status is not None else BackendStatus(backend_name)
        self.report = Reporter(self.status)
        self.clock: Callable[[], int] = host_ns
        self.window_start: int | None = None
        self.window_end: int | None = None

    @staticmethod
    def new_correlation_id() -> int:
        """A process-wide unique id, usable as a correlation or flow id."""
        return correlation.new_id()

    @staticmethod
    def new_correlation_ids(n: int) -> np.ndarray:
        """`n` new process-wide ids at once (int64 array), for backends that bring many rows."""
        return correlation.new_ids(n)

    @staticmethod
    def current_external_id() -> int:
        """The innermost host annotation or framework op open in the calling thread/task (0: none)."""
        return correlation.current_external_id()

    def hold_facility(self, facility: str) -> None:
        """Take a vendor facility that allows one user at a time (``"cupti"``: CUPTI's subscriber) for
        this session; :meth:`release_facility` gives it back. Others see it in :meth:`facility_holder`."""
        facilities.hold(facility, self.backend_name)

    def release_facility(self, facility: str) -> None:
        facilities.release(facility, self.backend_name)

    @staticmethod
    def facility_holder(facility: str) -> str | None:
        """Who holds `facility` now (a backend's name, or a framework's such as ``"torch"``), or None."""
        return facilities.holder(facility)


class Session(Protocol):
    def prepare(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def collect(self, sink: Sink) -> None: ...
    def close(self) -> None: ...


class SessionBase:
    """A session with nothing to warm up or release: subclass it and write ``start``, ``stop`` and
    ``collect``; ``flush(sink)`` (optional) hands over rows that are complete while recording::

        class MySession(SessionBase):
            def __init__(self, config, ctx):
                super().__init__(config, ctx)
            def start(self): ...
            def stop(self): ...
            def collect(self, sink): ...
    """

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.config = config
        self.ctx = ctx

    def prepare(self) -> None:
        """Warm-up before the first recording window (default: nothing)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def collect(self, sink: Sink) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the session holds (default: nothing)."""


@runtime_checkable
class Backend(Protocol):
    name: str
    api_version: int
    activities: frozenset[str]

    def probe(self) -> Availability: ...
    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Session: ...


def contract_problems(backend: Any) -> list[str]:
    """What is wrong with `backend` against contract v1 (empty when nothing is)."""
    problems = [f"missing attribute {a!r}" for a in REQUIRED_BACKEND_ATTRIBUTES if not hasattr(backend, a)]
    if problems:
        return problems
    if not isinstance(backend.name, str) or not backend.name.isidentifier():
        problems.append(f"name must be a short identifier string, got {backend.name!r}")
    if backend.api_version != API_VERSION:
        problems.append(
            f"api_version {backend.api_version!r} is not supported: this polyprof speaks version {API_VERSION}"
        )
    acts = backend.activities
    if isinstance(acts, str) or not acts or not all(isinstance(a, str) and a for a in acts):
        problems.append(f"activities must be a non-empty set of group names, got {acts!r}")
    for method in ("probe", "create_session"):
        if not callable(getattr(backend, method)):
            problems.append(f"{method} is not callable")
    from polyprof.plugin.traits import backend_trait_problems

    return problems + backend_trait_problems(backend)


