"""The backend contract, version 1: what a device or host backend implements, and what it is given.

A backend is any object with::

    name: str                      # short and unique: "cuda", "opencl", "host"
    api_version: int               # polyprof.backend.API_VERSION
    activities: frozenset[str]     # activity groups it serves: {"OPENCL"}, {"CPU"}, ...
    def probe(self) -> Availability: ...            # cheap, no side effects
    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Session: ...

and a session has ``prepare()``, ``start()``, ``stop()``, ``collect(sink)``, ``close()`` and, if its
device work can be attributed to host operations by the vendor library, ``push_correlation(id, kind)``
and ``pop_correlation(kind)``. A session whose ``stop``/``collect`` must run on the thread that
started the profile sets ``thread_affine = True`` (it then gets no time limit on those calls).

``docs/writing-a-backend.md`` walks through a complete backend.
"""

from __future__ import annotations

import operator
from collections import Counter as _Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from polyprof import correlation
from polyprof.clock import ClockMapping, host_ns
from polyprof.errors import ConfigError
from polyprof.model import (
    DEFAULT_CATEGORY,
    FLOW_AC2G,
    FLOW_NONE,
    HOST_DEVICE_KEY,
    ActivityBuilder,
    ActivityKind,
    ArgColumns,
    CodedStrings,
    Counters,
    Device,
    JSONColumn,
    Resource,
)

API_VERSION = 1
REQUIRED_BACKEND_ATTRIBUTES = ("name", "api_version", "activities", "probe", "create_session")
REQUIRED_SESSION_METHODS = ("prepare", "start", "stop", "collect", "close")


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
    """Where a session reports warnings, errors and dropped records; all end up in the trace."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.dropped: dict[str, int] = {}
        self.clock: dict[str, Any] = {}
        self.details: dict[str, Any] = {}
        self.attachments: dict[str, Any] = {}

    def attach(self, key: str, value: Any) -> None:
        """An in-memory object for the front ends (e.g. torch's own profiler result), kept on the trace
        (``trace.attachments``) but never written to a file."""
        self.attachments[key] = value

    def detail(self, key: str, value: Any) -> None:
        """A fact about how the backend recorded (JSON-serialisable), e.g. which recorder it used."""
        self.details[key] = value

    def warning(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def error(self, message: str) -> None:
        self.errors.append(message)

    def dropped_records(self, count: int, what: str = "records") -> None:
        if count:
            self.dropped[what] = self.dropped.get(what, 0) + int(count)

    def clock_mapping(self, mapping: ClockMapping, device: str = "") -> None:
        """Record how a device clock was mapped to the host clock (and how far off it may be)."""
        self.clock[device or "device"] = mapping.to_json()


class SessionContext:
    """What the engine gives a session: clock, ids, capture window, options, reporter."""

    def __init__(self, backend_name: str, options: Mapping[str, Any] | None = None) -> None:
        self.backend_name = backend_name
        self.options: Mapping[str, Any] = dict(options or {})
        self.report = Reporter()
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
        return correlation.current.get()


class Session(Protocol):
    def prepare(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def collect(self, sink: Sink) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    api_version: int
    activities: frozenset[str]

    def probe(self) -> Availability: ...
    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Session: ...


def reject_unknown_options(backend: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """For a backend's ``check_options``: a ConfigError naming the unknown keys and the known ones::

    reject_unknown_options("cuda", options, KNOWN_OPTIONS)
    """
    known = set(known)
    unknown = set(options) - known
    if unknown:
        raise ConfigError(
            f"{backend}: unknown option(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
        )


def require_int_options(backend: str, options: Mapping[str, Any], keys: Iterable[str], minimum: int) -> None:
    """For a backend's ``check_options``: each of `keys` that is given must be an int (not a bool)
    >= `minimum`."""
    for key in keys:
        if key not in options:
            continue
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ConfigError(f"{backend}: '{key}' must be {wanted}, got {value!r}")


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
    return problems


_CATEGORY_BY_INT = {int(k): cat for k, cat in DEFAULT_CATEGORY.items()}
_CATEGORY_TABLE = [_CATEGORY_BY_INT.get(k, "") for k in range(int(max(ActivityKind)) + 1)]


class SinkClosedError(RuntimeError):
    """The engine stopped listening to this sink (its collect ran past the time limit)."""


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("bool is not a timestamp")
    return operator.index(value)


def _code_problems(values: Any, key: str) -> tuple[np.ndarray, str]:
    """Rows whose code is outside the table of a CodedStrings column (none for a plain string column)."""
    if isinstance(values, CodedStrings):
        codes = np.asarray(values.codes, dtype=np.int64)
        return (codes < 0) | (codes >= len(values.table)), f"{key} code outside its string table"
    return np.zeros(len(values), dtype=bool), ""


def _subset(values: Any, keep: np.ndarray) -> Any:
    """The rows `keep` of a column in any form sink.activities takes (array, sequence, CodedStrings,
    JSONColumn)."""
    if isinstance(values, np.ndarray):
        return values[keep]
    if isinstance(values, CodedStrings):
        return CodedStrings(np.asarray(values.codes)[keep], values.table)
    if isinstance(values, JSONColumn):
        return JSONColumn(_subset(values.values, keep))
    return [values[i] for i in keep.tolist()]


class Sink:
    """Where a session's ``collect`` puts its devices, resources, activities and counters.

    Rows are checked as they arrive; a malformed row (end before start, unknown device or resource,
    non-integer timestamp) is rejected and counted, never written. Timestamps are host-clock ns
    (map device clocks with :class:`polyprof.clock.ClockMapping` first)::

        gpu = sink.device("mydev:0", type="gpu", index=0, name="My GPU", properties={"memory": 8 << 30})
        q = sink.resource(gpu, 3, "queue 3")
        t = sink.host_thread(threading.get_native_id())
        sink.activity(ActivityKind.RUNTIME, "myLaunch", device=sink.host_device(), resource=t,
                      start=s0, end=s1, cat="mydev_runtime", correlation=7, flow_id=7, flow_start=True)
        sink.activity(ActivityKind.KERNEL, "saxpy", device=gpu, resource=q, start=k0, end=k1,
                      correlation=7, external_id=ext, flow_id=7, args={"grid": [64, 1, 1]})
    """

    def __init__(self, backend_name: str) -> None:
        self.backend_name = backend_name
        self.builder = ActivityBuilder()
        self.devices: list[Device] = []
        self.resources: list[Resource] = []
        self.counters = Counters()
        self.metadata: dict[str, Any] = {}
        self.device_properties: list[dict[str, Any]] = []
        self.rejected: _Counter[str] = _Counter()
        self.closed = False
        self._device_keys: dict[str, int] = {}
        self._resource_keys: dict[tuple[int, int], int] = {}

    # -- devices and resources ------------------------------------------------------------------
    def device(
        self,
        key: str,
        *,
        type: str,
        index: int = 0,
        name: str | None = None,
        properties: Mapping[str, Any] | None = None,
        sort_index: int | None = None,
        pid: int | None = None,
        label: str = "",
    ) -> int:
        """Declare (or look up) a device; returns its handle. `pid` is the preferred trace pid."""
        self._check_open()
        handle = self._device_keys.get(key)
        if handle is None:
            handle = len(self.devices)
            self.devices.append(
                Device(
                    key=key,
                    type=type,
                    index=index,
                    name=name or key,
                    properties=dict(properties or {}),
                    sort_index=5_000_000 + index if sort_index is None else sort_index,
                    pid=index if pid is None else pid,
                    label=label,
                )
            )
            self._device_keys[key] = handle
        return handle

    def host_device(self) -> int:
        """The profiled process itself (one trace process shared by every backend)."""
        return self.device(HOST_DEVICE_KEY, type="cpu", index=0, sort_index=0, label="CPU")

    def resource(
        self, device: int, resource_id: int, name: str | None = None, sort_index: int | None = None
    ) -> int:
        """Declare (or look up) a row of `device`: a stream, a queue, a host thread."""
        self._check_open()
        if not 0 <= device < len(self.devices):
            raise ValueError(f"unknown device handle {device}: declare it with sink.device() first")
        rid = _as_int(resource_id)
        key = (device, rid)
        handle = self._resource_keys.get(key)
        if handle is None:
            handle = len(self.resources)
            self.resources.append(
                Resource(device, rid, name or f"resource {rid}", rid if sort_index is None else sort_index)
            )
            self._resource_keys[key] = handle
        return handle

    def host_thread(self, tid: int, name: str | None = None) -> int:
        """The row of a host thread (by native thread id) in the host process."""
        label = f"thread {tid} ({name})" if name else f"thread {tid}"
        return self.resource(self.host_device(), tid, label)

    # -- rows -------------------------------------------------------------------------------------
    def activity(
        self,
        kind: ActivityKind | int,
        name: str,
        *,
        device: int,
        resource: int,
        start: int,
        end: int,
        cat: str | None = None,
        correlation: int = 0,
        external_id: int = 0,
        flow_id: int = 0,
        flow_start: bool = False,
        flow_type: int = FLOW_AC2G,
        args: dict[str, Any] | None = None,
    ) -> bool:
        """Add one activity; returns False (and counts why) when the row is rejected."""
        self._check_open()
        try:
            kind = ActivityKind(kind)
            start = _as_int(start)
            end = _as_int(end)
        except (TypeError, ValueError) as exc:
            self.rejected[f"invalid kind or timestamp ({type(exc).__name__})"] += 1
            return False
        reason = self._row_problem(device, resource, start, end)
        if reason:
            self.rejected[reason] += 1
            return False
        self.builder.append(
            kind,
            cat or DEFAULT_CATEGORY[kind],
            str(name),
            device,
            resource,
            start,
            end,
            int(correlation),
            int(external_id),
            int(flow_id),
            flow_type if flow_id else FLOW_NONE,
            flow_start,
            args,
        )
        return True

    def activities(
        self,
        columns: Mapping[str, Any],
        args: Mapping[int, dict] | None = None,
        arg_columns: ArgColumns | None = None,
    ) -> int:
        """Add many activities at once from columns (see ``polyprof.model.COLUMN_NAMES``; `kind`, `name`,
        `device`, `resource`, `start`, `end` are required, `cat` defaults per kind). `name` and `cat` are
        sequences of strings, or :class:`~polyprof.model.CodedStrings` (integer codes into a table),
        which spares a backend with its own string table one Python string per row. `args` maps row numbers
        to dicts; `arg_columns` (:class:`~polyprof.model.ArgColumns`: the same keys for every row, one
        column each) spares a dict per row. A row with both gets both (the dict wins on a shared key).
        Returns rows kept."""
        self._check_open()
        n = len(columns["start"])
        try:
            start = np.asarray(columns["start"])
            end = np.asarray(columns["end"])
            if start.dtype.kind not in "iu" or end.dtype.kind not in "iu":
                raise TypeError("timestamps must be integers")
            start = start.astype(np.int64)
            end = end.astype(np.int64)
            kind = np.asarray(columns["kind"], dtype=np.int64)
            device = np.asarray(columns["device"], dtype=np.int64)
            resource = np.asarray(columns["resource"], dtype=np.int64)
        except (TypeError, ValueError):
            self.rejected["invalid kind or timestamp (TypeError)"] += n
            return 0
        ok = np.ones(n, dtype=bool)
        checks = (
            (end < start, "end before start"),
            ((device < 0) | (device >= len(self.devices)), "unknown device"),
            ((resource < 0) | (resource >= len(self.resources)), "unknown resource"),
            ((kind < 0) | (kind > max(ActivityKind)), "invalid kind or timestamp (ValueError)"),
            *(_code_problems(columns[key], key) for key in ("name", "cat") if key in columns),
        )
        for bad, reason in checks:
            bad &= ok
            if bad.any():
                self.rejected[reason] += int(bad.sum())
                ok &= ~bad
        if ok.any():
            res_dev = np.array([r.device for r in self.resources], dtype=np.int64)
            wrong = (
                ok & (res_dev[np.clip(resource, 0, max(len(res_dev) - 1, 0))] != device)
                if len(res_dev)
                else ok
            )
            if wrong.any():
                self.rejected["resource belongs to another device"] += int(wrong.sum())
                ok &= ~wrong
        keep = np.flatnonzero(ok)
        if len(keep) == 0:
            return 0
        everything = len(keep) == n  # the usual case: no re-indexing of names, categories and args
        cols: dict[str, Any] = {}
        for key in ("correlation", "external_id", "flow_id", "flow_type", "flow_start"):
            if key in columns:
                cols[key] = np.asarray(columns[key]) if everything else np.asarray(columns[key])[keep]
        if everything:
            cols.update(kind=kind, device=device, resource=resource, start=start, end=end)
        else:
            cols.update(
                kind=kind[keep],
                device=device[keep],
                resource=resource[keep],
                start=start[keep],
                end=end[keep],
            )
        cols["name"] = columns["name"] if everything else _subset(columns["name"], keep)
        cats = columns.get("cat")
        if cats is None:
            cols["cat"] = CodedStrings(cols["kind"], _CATEGORY_TABLE)
        else:
            cols["cat"] = cats if everything else _subset(cats, keep)
        kept_columns = None
        if arg_columns is not None:
            if len(arg_columns.keys) != len(arg_columns.columns) or any(
                len(c) != n for c in arg_columns.columns
            ):
                raise ValueError(
                    f"ArgColumns needs one column per key and one value per row ({n} rows); got "
                    f"{len(arg_columns.keys)} keys and columns of lengths {[len(c) for c in arg_columns.columns]}"
                )
            kept_columns = (
                arg_columns
                if everything
                else ArgColumns(arg_columns.keys, tuple(_subset(c, keep) for c in arg_columns.columns))
            )
        kept_args = None
        if args:
            if everything:
                kept_args = args
            else:
                position = {old: new for new, old in enumerate(keep.tolist())}
                kept_args = {position[i]: a for i, a in args.items() if i in position}
        self.builder.extend_columns(cols, kept_args, kept_columns)
        return len(keep)

    def instant(self, name: str, *, device: int, resource: int, ts: int, args: dict | None = None) -> bool:
        return self.activity(
            ActivityKind.INSTANT, name, device=device, resource=resource, start=ts, end=ts, args=args
        )

    def counter(
        self, name: str, value: float, *, ts: int, device: int | None = None, resource: int = -1
    ) -> bool:
        """One sample of a counter track (on the host process unless `device` is given)."""
        self._check_open()
        dev = self.host_device() if device is None else device
        try:
            ts = _as_int(ts)
            value = float(value)
        except (TypeError, ValueError):
            self.rejected["invalid counter sample"] += 1
            return False
        if not 0 <= dev < len(self.devices):
            self.rejected["unknown device"] += 1
            return False
        self.counters.add(name, dev, ts, value, resource)
        return True

    def add_metadata(self, key: str, value: Any) -> None:
        """A top-level key of the trace (JSON-serialisable), e.g. ``cupti_version``."""
        self.metadata[key] = value

    def add_device_properties(self, properties: Mapping[str, Any]) -> None:
        """One entry of the trace's `deviceProperties` list (Kineto's keys where they apply)."""
        self.device_properties.append(dict(properties))

    # -- internals --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise SinkClosedError(f"{self.backend_name}: the engine no longer accepts rows from this collect")

    def _row_problem(self, device: Any, resource: Any, start: int, end: int) -> str:
        if end < start:
            return "end before start"
        if type(device) is not int or not 0 <= device < len(self.devices):
            return "unknown device"
        if type(resource) is not int or not 0 <= resource < len(self.resources):
            return "unknown resource"
        if self.resources[resource].device != device:
            return "resource belongs to another device"
        return ""
