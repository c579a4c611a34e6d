"""The Sink: where a session's ``collect`` (or ``flush``) hands over its devices, rows and counters.

One schema for both ways in (:data:`ROW_COLUMNS`): :meth:`Sink.activity` for a row at a time,
:meth:`Sink.activities` for columns; the same defaults and the same checks apply to both. Two kinds of
problem, two outcomes:

- **a row that is wrong** (end before start, an unknown device or resource handle, a timestamp that is
  not an integer, a name code outside its table) is rejected and counted, never raised: it ends up in the
  backend's status (``rejected``, ``rejected_reasons``) and the rest of the rows are kept;
- **a call the Sink cannot understand** (a misspelt column, a missing one, columns of different lengths,
  args that are not dicts, a call after the sink was closed) raises
  :class:`~polyprof.errors.BackendContractError` naming the backend: it is a bug in the backend.

Timestamps are host-clock ns (map device clocks with :class:`polyprof.plugin.clock.ClockMapping` first)::

    gpu = sink.device("mydev:0", type="gpu", index=0, name="My GPU", properties={"memory": 8 << 30})
    q = sink.resource(gpu, 3, "queue 3")
    t = sink.host_thread(threading.get_native_id())
    sink.activity(ActivityKind.RUNTIME, "myLaunch", device=sink.host_device(), resource=t,
                  start=s0, end=s1, cat="mydev_runtime", correlation=7, flow_id=7, flow_start=True)
    sink.activity(ActivityKind.KERNEL, "saxpy", device=gpu, resource=q, start=k0, end=k1,
                  correlation=7, external_id=ext, flow_id=7, args={"grid": [64, 1, 1]})
    sink.activities({"kind": kinds, "name": CodedStrings(codes, table), "device": devs,
                     "resource": queues, "start": starts, "end": ends, "flow_id": ids})

Arrays handed to :meth:`activities` belong to the sink afterwards (they are not copied where their
dtype is already the stored one): do not modify them. The engine seals the sink into an immutable
:class:`~polyprof.model.CollectedPart` when the call returns.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from polyprof.errors import BackendContractError, SinkClosedError
from polyprof.model import (
    HOST_DEVICE_KEY,
    HOST_TIME_LIMIT_NS,
    ActivityBuilder,
    ActivityKind,
    ArgColumns,
    BackendStatus,
    CollectedPart,
    Counters,
    Device,
    Resource,
)
from polyprof.model.strings import as_name
from polyprof.plugin.sink_rows import (
    as_int,
    checked_columns,
    columns_of_rows,
)

_PENDING_ROWS = 4096  # rows from activity() are checked and stored in batches of this many


def _locked(method: Any) -> Any:
    """One thread at a time in the sink: a backend's own thread may hand rows over while the engine
    seals the sink (they are then kept or counted as late, never half-copied)."""

    @functools.wraps(method)
    def call(self: Sink, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return call


class Sink:
    """See the module docstring."""

    def __init__(self, backend_name: str) -> None:
        self.backend_name = backend_name
        self.builder = ActivityBuilder()
        self.devices: list[Device] = []
        self.resources: list[Resource] = []
        self.counters = Counters()
        self.metadata: dict[str, Any] = {}
        self.device_properties: list[dict[str, Any]] = []
        self.closed = False
        self._late: tuple[BackendStatus, str] | None = None  # where rows arriving after closing are counted
        self._rejected: Counter[str] = Counter()
        self._pending: list[tuple] = []
        self._device_keys: dict[str, int] = {}
        self._resource_keys: dict[tuple[int, int], int] = {}
        self._lock = threading.RLock()

    @property
    def rejected(self) -> dict[str, int]:
        """Rows rejected so far, by reason."""
        with self._lock:
            self._flush_pending()
            return dict(self._rejected)

    # -- devices and resources ------------------------------------------------------------------
    @_locked
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
        if not self._check_open(0):
            return 0  # a late declaration: its rows are counted as dropped
        handle = self._device_keys.get(key)
        if handle is None:
            if not isinstance(key, str) or not key:
                self._misuse(f"a device key must be a non-empty string, got {key!r}")
            try:
                index = as_int(index)
            except TypeError:
                self._misuse(f"device {key!r}: index must be an integer, got {index!r}")
            handle = len(self.devices)
            self.devices.append(
                Device(
                    key=key,
                    type=str(type),
                    index=index,
                    name=as_name(name or key),
                    properties=dict(properties or {}),
                    sort_index=5_000_000 + index if sort_index is None else int(sort_index),
                    pid=index if pid is None else int(pid),
                    label=str(label),
                )
            )
            self._device_keys[key] = handle
        return handle

    def host_device(self) -> int:
        """The profiled process itself (one trace process shared by every backend)."""
        return self.device(HOST_DEVICE_KEY, type="cpu", index=0, sort_index=0, label="CPU")

    @_locked
    def resource(
        self, device: int, resource_id: int, name: str | None = None, sort_index: int | None = None
    ) -> int:
        """Declare (or look up) a row of `device`: a stream, a queue, a host thread."""
        if not self._check_open(0):
            return 0  # a late declaration: its rows are counted as dropped
        if type(device) is not int or not 0 <= device < len(self.devices):
            self._misuse(f"resource(): unknown device handle {device!r}: declare it with sink.device() first")
        try:
            rid = as_int(resource_id)
        except TypeError:
            self._misuse(f"resource(): the id must be an integer, got {resource_id!r}")
        key = (device, rid)
        handle = self._resource_keys.get(key)
        if handle is None:
            handle = len(self.resources)
            self.resources.append(
                Resource(device, rid, as_name(name or f"resource {rid}"), rid if sort_index is None else int(sort_index))
            )
            self._resource_keys[key] = handle
        return handle

    def host_thread(self, tid: int, name: str | None = None) -> int:
        """The row of a host thread (by native thread id) in the host process."""
        label = f"thread {tid} ({name})" if name else f"thread {tid}"
        return self.resource(self.host_device(), tid, label)

    # -- rows -------------------------------------------------------------------------------------
    @_locked
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
        flow_type: int | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """One row (the columns of :data:`ROW_COLUMNS` as keywords, plus its `args` dict). Rows are checked
        in batches, with the same rules as :meth:`activities`; rejections show in :attr:`rejected`."""
        if not self._check_open():
            return
        if args is not None and not isinstance(args, dict):
            self._misuse(f"activity {name!r}: args must be a dict or None, got {type(args).__name__}")
        self._pending.append(
            (kind, cat, name, device, resource, start, end, correlation, external_id, flow_id, flow_type,
             flow_start, args)
        )
        if len(self._pending) >= _PENDING_ROWS:
            self._flush_pending()

    @_locked
    def activities(
        self,
        columns: Mapping[str, Any],
        args: Mapping[int, dict] | None = None,
        arg_columns: ArgColumns | None = None,
    ) -> int:
        """Many rows at once from columns named as in :data:`ROW_COLUMNS`. `name` and `cat` are sequences of
        strings, or :class:`~polyprof.model.CodedStrings` (integer codes into a table, which spares a
        backend with its own string table one Python string per row); numbers are numpy arrays (or
        sequences). `args` maps row numbers to dicts; `arg_columns` (:class:`~polyprof.model.ArgColumns`:
        the same keys for every row, one column each) spares a dict per row; a row with both gets both (the
        dict wins on a shared key). Returns the number of rows kept."""
        if not self._check_open(len(columns["start"]) if "start" in columns else 1):
            return 0
        self._flush_pending()
        return self._accept(columns, args, arg_columns)

    def instant(self, name: str, *, device: int, resource: int, ts: int, args: dict | None = None) -> None:
        self.activity(ActivityKind.INSTANT, name, device=device, resource=resource, start=ts, end=ts, args=args)

    @_locked
    def counter(self, name: str, value: float, *, ts: int, device: int | None = None, resource: int = -1) -> bool:
        """One sample of a counter track (on the host process unless `device` is given)."""
        if not self._check_open():
            return False
        dev = self.host_device() if device is None else device
        try:
            ts = as_int(ts)
            value = float(value)
            if not -HOST_TIME_LIMIT_NS <= ts <= HOST_TIME_LIMIT_NS:
                raise OverflowError
        except (TypeError, ValueError, OverflowError):
            self._rejected["invalid counter sample"] += 1
            return False
        if type(dev) is not int or not 0 <= dev < len(self.devices):
            self._rejected["unknown device"] += 1
            return False
        if resource != -1 and (type(resource) is not int or not 0 <= resource < len(self.resources)):
            self._rejected["unknown resource"] += 1
            return False
        self.counters.add(as_name(name), dev, ts, value, resource)
        return True

    @_locked
    def add_metadata(self, key: str, value: Any) -> None:
        """A top-level key of the trace (JSON-serialisable), e.g. ``cupti_version``."""
        if not self._check_open(0):
            return
        self.metadata[str(key)] = value

    @_locked
    def add_device_properties(self, properties: Mapping[str, Any]) -> None:
        """One entry of the trace's `deviceProperties` list (Kineto's keys where they apply)."""
        if not self._check_open(0):
            return
        self.device_properties.append(dict(properties))

    # -- sealing ----------------------------------------------------------------------------------
    @_locked
    def seal(self, status: BackendStatus, *, context_scoped: bool = False) -> CollectedPart:
        """Hand everything over as an immutable part (the engine calls this; the sink is closed after)."""
        self._flush_pending()
        self.closed = True
        self._late = (status, "rows after collect returned")
        status.add_rejected(dict(self._rejected))
        acts = self.builder.freeze()
        for col in acts.columns.values():
            col.flags.writeable = False
        self.builder = ActivityBuilder()  # the part owns the columns now
        return CollectedPart(
            backend=self.backend_name,
            status=status,
            activities=acts,
            devices=tuple(self.devices),
            resources=tuple(self.resources),
            counters=self.counters,
            metadata=dict(self.metadata),
            device_properties=tuple(self.device_properties),
            context_scoped=context_scoped,
        )

    # -- internals --------------------------------------------------------------------------------
    @_locked
    def abandon(self, status: BackendStatus, what: str) -> None:
        """Stop listening (a collect past its time limit): rows handed over later are counted as
        dropped on `status` under `what`, not kept."""
        self.closed = True
        self._late = (status, what)

    def _check_open(self, rows: int = 1) -> bool:
        """True while the sink takes rows. Rows arriving after it was sealed or abandoned (a backend's
        own thread still emitting) are counted as dropped on the backend's status and warned about;
        a sink closed any other way raises SinkClosedError."""
        if not self.closed:
            return True
        if self._late is None:
            raise SinkClosedError(self.backend_name, "the engine no longer accepts rows from this sink")
        status, what = self._late
        status.add_dropped(what, rows)
        return False

    def _misuse(self, message: str) -> None:
        raise BackendContractError(self.backend_name, message)

    def _flush_pending(self) -> None:
        if self._pending:
            rows, self._pending = self._pending, []
            self._accept(*columns_of_rows(rows, self._rejected), None)

    def _accept(self, columns: Mapping[str, Any], args: Mapping[int, dict] | None, arg_columns: ArgColumns | None) -> int:
        kept = checked_columns(columns, args, arg_columns, len(self.devices), self.resources, self._rejected, self._misuse)
        if kept is None:
            return 0
        self.builder.extend_columns(*kept)
        return len(kept[0]["start"])
