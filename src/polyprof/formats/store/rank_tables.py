"""One rank's trace as the store's tables (:mod:`polyprof.formats.store.schema`): its rows on the job's clock,
each with its step, its nesting level and, for a collective, its instance.

::

    tables = rank_tables(load_trace("rank2.json"), source="rank2.json")
    tables.rank, tables["activities"]            # 2, a pyarrow.Table sorted by step
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from polyprof import _native
from polyprof.formats.common.job import rank_of, recorded_offset
from polyprof.formats.store.rank_args import ArgColumns, args_columns, encode
from polyprof.formats.store.schema import ACTIVITIES, BACKENDS, COLLECTIVES, COUNTERS, RANKS
from polyprof.model import ActivityKind, Trace
from polyprof.model.steps import step_number, step_rows
from polyprof.model.work import COMMUNICATION, COMPUTATION, MEMORY, OTHER, DeviceWork, device_heading

WORK_TYPES = [COMPUTATION, COMMUNICATION, MEMORY, OTHER]
DEVICE_KINDS = (ActivityKind.KERNEL, ActivityKind.GPU_MEMCPY, ActivityKind.GPU_MEMSET, ActivityKind.GPU_USER_ANNOTATION,
                ActivityKind.COLLECTIVE_COMM)
#: bytes per element by the dtype names torch writes ("Float", "c10::Half", "BFloat16", ...)
DTYPE_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "short": 2, "char": 1,
               "byte": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: collectives that no rank leaves before every rank of the group has entered (a broadcast's root, a
#: send, a reduce's non-roots may leave first): the ones that say who made everyone wait
SYNCHRONIZING = {"allreduce", "all_reduce", "allgather", "all_gather", "allgather_into_tensor", "_allgather_base",
                 "allgather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
                 "alltoall", "all_to_all", "alltoall_base", "barrier", "allreduce_coalesced"}
#: the ``kind`` column's names, by ActivityKind's value
KIND_NAMES = [k.name.lower() for k in sorted(ActivityKind)]
#: the activities columns a row's own fields give (:func:`row_columns`)
ROW_COLUMNS = ("category", "name", "correlation", "external_id", "flow_id", "flow_type", "flow_start", "collective",
               "work", "input_dims", "input_types", "args")


@dataclass
class RankTables:
    """A rank's tables, by name, and where it sits in the job."""

    rank: int
    tables: dict[str, pa.Table] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pa.Table:
        return self.tables[name]


def rank_tables(trace: Trace, source: str = "", fallback_rank: int = 0) -> RankTables:
    """The store's tables for `trace` (one rank); `fallback_rank` where the trace does not say its rank."""
    offset, uncertainty = recorded_offset(trace)
    shift = trace.epoch_offset_ns + (offset or 0)  # host clock -> the job's (rank 0's) epoch ns
    steps = _steps(trace)
    args = args_columns(trace.activities.args, len(trace.activities))
    tables = {
        "activities": _activities(trace, steps, shift, args),
        "collectives": collectives_table(collective_rows(trace, args.collective), steps, shift),
        "counters": counters_table(trace, steps, shift),
        "backends": backends_table(trace),
        "ranks": rank_row(trace, source, shift, offset, uncertainty),
    }
    return RankTables(rank_of(trace, fallback_rank), tables)


def backends_table(trace: Trace) -> pa.Table:
    return pa.Table.from_pylist([_backend_row(s) for s in trace.backends.values()], schema=BACKENDS)


def counters_table(trace: Trace, steps: Any, shift: int) -> pa.Table:
    counters = trace.counters.columns
    names = pa.array(trace.counters.strings.strings or [""], pa.string())
    devices = trace.devices
    return pa.table({
        "name": pa.DictionaryArray.from_arrays(counters["name"], names),
        "device": pa.array([devices[d].key for d in counters["device"].tolist()], pa.string()),
        "resource": counters["resource"].astype(np.int64),
        "ts_ns": counters["ts"] + shift,
        "value": counters["value"],
        "step": step_at(steps, counters["ts"]),
    }, schema=COUNTERS)


def rank_row(trace: Trace, source: str, shift: int, offset: int | None, uncertainty: int | None,
             events: int | None = None) -> pa.Table:
    """The rank's one row; `events` where the trace is the file's head, its rows streamed."""
    info = trace.metadata.get("distributedInfo")
    return pa.Table.from_pylist([{
        "world_size": info.get("world_size") if isinstance(info, dict) else None,
        "host": str(trace.metadata.get("host_name", "")),
        "source": source,
        "epoch_offset_ns": trace.epoch_offset_ns,
        "offset_ns": offset or 0,
        "offset_uncertainty_ns": uncertainty,
        "window_start_ns": trace.window[0] + shift,
        "window_end_ns": trace.window[1] + shift,
        "events": len(trace.activities) if events is None else events,
        "metadata": encode(trace.metadata),
    }], schema=RANKS)


def _steps(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(numbers, starts, ends, rows) of the trace's steps, by start."""
    acts = trace.activities
    rows = step_rows(trace)
    idx = np.array(list(rows.values()), dtype=np.int64)
    starts = acts["start"][idx] if len(idx) else np.zeros(0, np.int64)
    ends = acts["end"][idx] if len(idx) else np.zeros(0, np.int64)
    return steps_by_start(np.array(list(rows), dtype=np.int64), starts, ends, idx)


def steps_by_start(numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> tuple:
    """The steps (numbers, starts, ends, rows: each step's span) ordered by start, as :func:`step_at`
    reads them."""
    order = np.argsort(starts, kind="stable")
    return numbers[order], starts[order], ends[order], rows[order]


def step_at(steps: tuple[np.ndarray, ...], times: np.ndarray) -> np.ndarray:
    """The step whose span holds each time (-1 where none)."""
    numbers, starts, ends, _ = steps
    if not len(numbers):
        return np.full(len(times), -1, dtype=np.int64)
    i = np.searchsorted(starts, times, side="right") - 1
    inside = (i >= 0) & (times < ends[np.clip(i, 0, None)])
    return np.where(inside, numbers[np.clip(i, 0, None)], -1)


def _levels(resource: np.ndarray, start: np.ndarray, end: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """Each row's nesting level on its resource (rows in `skip`, the step spans, are not counted)."""
    return sorted_levels(resource, start, end, skip, np.lexsort((-end, start, resource)))


def sorted_levels(resource: np.ndarray, start: np.ndarray, end: np.ndarray, skip: np.ndarray,
                  order: np.ndarray) -> np.ndarray:
    """Each row's nesting level on its resource, `order` being the rows by (resource, start, longest
    first): a stack of ends, popped while its top has ended."""
    level = np.zeros(len(start), dtype=np.int32)
    as_int64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    _native.nesting_levels(order.astype(np.int64), as_int64(resource), as_int64(start), as_int64(end),
                           np.ascontiguousarray(skip, dtype=np.uint8), level)
    return level


def _training_thread(trace: Trace, step_rows: np.ndarray) -> int:
    acts = trace.activities
    if len(step_rows):
        return int(acts["resource"][step_rows[0]])
    values, counts = np.unique(acts["resource"][acts["kind"] == int(ActivityKind.CPU_OP)], return_counts=True)
    return busiest(values, counts)


def busiest(resources: np.ndarray, op_counts: np.ndarray) -> int:
    """The training thread where a rank has no steps: the resource with most operators (the first of
    equals), -1 for none."""
    return int(resources[np.argmax(op_counts)]) if len(resources) else -1


def _activities(trace: Trace, steps: Any, shift: int, args: ArgColumns) -> pa.Table:
    acts = trace.activities
    kind, start, end, resource = acts["kind"], acts["start"], acts["end"], acts["resource"]
    step = step_at(steps, start)
    device_rows = on_device(kind)
    corr = acts["correlation"]
    if device_rows.any():  # device rows take their launch's step
        launches = ~device_rows & (corr != 0)
        by_corr = dict(zip(corr[launches].tolist(), step[launches].tolist(), strict=True))
        rows = np.flatnonzero(device_rows & (corr != 0))
        step[rows] = [by_corr.get(c, s) for c, s in zip(corr[rows].tolist(), step[rows].tolist(), strict=True)]
    places = RankPlaces.of(trace, _training_thread(trace, steps[3]), shift)
    table = pa.table({
        "step": step,
        **places.columns(kind, acts["device"], resource, start, end),
        "level": _levels(resource, start, end, not_nested(trace)),
        **row_columns(trace, args),
    }, schema=ACTIVITIES)
    return table.take(np.lexsort((-end, start, step)))  # of one start, the outer row first


def on_device(kind: np.ndarray) -> np.ndarray:
    """Which rows (by their kind) are a device's work."""
    return np.isin(kind, [int(k) for k in DEVICE_KINDS])


def not_nested(trace: Trace) -> np.ndarray:
    """The rows the nesting levels leave out: the step spans and the instants."""
    acts = trace.activities
    codes = [c for c, s in enumerate(acts.strings.strings) if step_number(s) is not None]
    is_step = np.isin(acts["name"], codes) if codes else np.zeros(len(acts), dtype=bool)
    return is_step | (acts["kind"] == int(ActivityKind.INSTANT))


def row_columns(trace: Trace, args: ArgColumns) -> dict[str, Any]:
    """The activities columns each row's own fields give (:data:`ROW_COLUMNS`): its names, ids, flow,
    whether it is a collective, its kind of work and its args."""
    acts = trace.activities
    strings = pa.array(acts.strings.strings or [""], pa.string())
    collective = np.zeros(len(acts), dtype=bool)
    collective[list(args.collective)] = True
    return {
        "category": pa.DictionaryArray.from_arrays(acts["cat"], strings),
        "name": pa.DictionaryArray.from_arrays(acts["name"], strings),
        "correlation": acts["correlation"],
        "external_id": acts["external_id"],
        "flow_id": acts["flow_id"],
        "flow_type": acts["flow_type"],
        "flow_start": acts["flow_start"] != 0,
        "collective": collective,
        "work": work_column(trace),
        "input_dims": pa.array(args.input_dims, pa.string()),
        "input_types": pa.array(args.input_types, pa.string()),
        "args": pa.array(args.other, pa.string()),
    }


@dataclass
class RankPlaces:
    """What a rank's devices, threads and clock make of its rows' indices and times: the activities
    columns only the whole trace decides. ``RankPlaces.of(trace, training, shift).columns(...)``."""

    devices: tuple[pa.Array, pa.Array, pa.Array]  # each device's key, type and heading, by index
    resource_ids: np.ndarray  # each resource's id (tid, stream), by index
    resource_names: pa.Array
    training: int  # the training thread's resource index
    shift: int  # host clock -> the job's epoch ns

    @classmethod
    def of(cls, trace: Trace, training: int, shift: int) -> RankPlaces:
        devices = trace.devices
        return cls((pa.array([d.key for d in devices] or [""], pa.string()),
                    pa.array([d.type for d in devices] or [""], pa.string()),
                    pa.array([device_heading(trace, i) for i in range(len(devices))] or [""], pa.string())),
                   np.array([r.id for r in trace.resources] or [0], dtype=np.int64),
                   pa.array([r.name for r in trace.resources] or [""], pa.string()), training, shift)

    def columns(self, kind: np.ndarray, device: np.ndarray, resource: np.ndarray, start: np.ndarray,
                end: np.ndarray) -> dict[str, Any]:
        key, type_, heading = self.devices
        return {
            "kind": pa.DictionaryArray.from_arrays(kind.astype(np.int32), pa.array(KIND_NAMES)).cast(pa.string()),
            "device": pa.DictionaryArray.from_arrays(device, key),
            "device_type": pa.DictionaryArray.from_arrays(device, type_),
            "device_name": pa.DictionaryArray.from_arrays(device, heading),
            "resource": self.resource_ids[resource],
            "resource_name": pa.DictionaryArray.from_arrays(resource, self.resource_names),
            "training_thread": resource == self.training,
            "start_ns": start + self.shift,
            "end_ns": end + self.shift,
            "dur_ns": end - start,
        }


def work_column(trace: Trace) -> pa.Array:
    """Each device row's kind of work, as the in-memory analyses classify it (one owner:
    :class:`polyprof.model.work.DeviceWork`); null for the other rows."""
    work = DeviceWork(trace)
    labels = [WORK_TYPES.index(t) for t in work.type.tolist()]
    codes = np.full(len(trace.activities), -1, dtype=np.int32)
    codes[work.rows] = labels
    return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(WORK_TYPES, pa.string()))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class CollectiveRow:
    """A row that names a collective: its args, and what the collectives table needs of the row."""

    args: dict[str, Any]
    name: str
    on_device: bool
    start: int
    end: int


def collective_rows(trace: Trace, collective: dict[int, dict]) -> list[CollectiveRow]:
    """The rows of `trace` that name a collective (`collective`: their args, by row), in row order."""
    acts = trace.activities
    names = acts.strings.strings
    device_kinds = [int(k) for k in DEVICE_KINDS]
    return [CollectiveRow(collective[row], names[int(acts["name"][row])], int(acts["kind"][row]) in device_kinds,
                          int(acts["start"][row]), int(acts["end"][row])) for row in sorted(collective)]


def collectives_table(candidates: list[CollectiveRow], steps: Any, shift: int) -> pa.Table:
    """One row per collective instance of this rank: device rows where the rank has them (NCCL's
    kernels), else host rows; numbered per process group in the order they started, the order every
    rank of a group issues them in (or by the ``Seq`` arg where the trace has it)."""
    if any(c.on_device for c in candidates):
        candidates = [c for c in candidates if c.on_device]
    chosen = sorted(candidates, key=lambda c: (c.start, -c.end))  # stable: rows of one start and end in row order
    seen: dict[str, int] = {}
    out = []
    step = step_at(steps, np.array([c.start for c in chosen], dtype=np.int64))
    for i, row in enumerate(chosen):
        args = row.args
        group = str(args.get("Process Group Name", "0"))
        seq = _int(args.get("Seq", args.get("seq")))
        if seq is None:
            seq = seen.get(group, 0)
            seen[group] = seq + 1
        nelems = _int(args.get("In msg nelems"))
        dtype = str(args.get("dtype", ""))
        size = DTYPE_BYTES.get(dtype.lower().removeprefix("c10::"))
        out.append({
            "process_group": group,
            "group_description": str(args.get("Process Group Description", "")),
            "seq": seq,
            "op": (op := str(args.get("Collective name", ""))),
            "name": row.name,
            "on_device": row.on_device,
            "synchronizing": op.lower() in SYNCHRONIZING,
            "group_size": _int(args.get("Group size")),
            "in_nelems": nelems,
            "out_nelems": _int(args.get("Out msg nelems")),
            "dtype": dtype,
            "bytes": nelems * size if nelems is not None and size is not None else None,
            "step": int(step[i]),
            "entry_ns": row.start + shift,
            "exit_ns": row.end + shift,
        })
    return pa.Table.from_pylist(out, schema=COLLECTIVES)


def _backend_row(status: Any) -> dict[str, Any]:
    doc = status.to_json()
    return {
        "backend": status.name,
        "state": status.state,
        "reason": status.reason,
        "activities": status.activities,
        "rejected": status.rejected,
        "dropped": encode(status.dropped),
        "errors": encode(status.errors),
        "warnings": encode(status.warnings),
        "status": encode(doc),
    }
