"""Rows from polyprof's observer: operators (already host-clock ns, native thread ids) and, with
profile_memory, the allocator's reports as ``[memory]`` instants, with the args torch.profiler writes."""

from __future__ import annotations

import numpy as np
import orjson

from polyprof.backends.torch import flows
from polyprof.backends.torch.distributed import collective_args
from polyprof.model import FLOW_FWDBWD, ActivityKind, ArgColumns, CodedStrings, JSONColumn
from polyprof.model.args import sorted_unique
from polyprof.plugin.backend import ProfileConfig, SessionContext
from polyprof.plugin.sink import Sink
from polyprof.torch import observer
from polyprof.torch.attachments import OVERLOAD_ARG

#: the arg carrying an op's overload name with capture_overload_names (its trace name is "name.overload")


def collect_observed(
    obs: observer.Observer,
    n: int,
    sink: Sink,
    config: ProfileConfig,
    ctx: SessionContext,
    stop_ns: int,
    carry: dict[tuple[int, int], tuple[int, int]] | None = None,
    job: dict | None = None,
) -> None:
    """Put what `obs` recorded or handed over (`n` operators) into `sink`; `carry` links forward ops
    to backward nodes across hand-overs (see :func:`flows.fwdbwd_flows`); `job` is the job's
    distributedInfo (None outside torch.distributed), which completes the args of collectives."""
    if n:
        _operators(obs, n, sink, config, ctx, stop_ns, carry, job)
    if config.profile_memory:
        memory = obs.memory()
        if len(memory["ts"]):
            _memory(memory, sink)


def _operators(
    obs: observer.Observer,
    n: int,
    sink: Sink,
    config: ProfileConfig,
    ctx: SessionContext,
    stop_ns: int,
    carry: dict[tuple[int, int], tuple[int, int]] | None,
    job: dict | None = None,
) -> None:
    cols, names = obs.columns(n)
    seq, fwd_tid = cols["seq"], cols["fwd_tid"]
    user = cols["scope"] == observer.USER_SCOPE
    kinds = np.where(user, int(ActivityKind.USER_ANNOTATION), int(ActivityKind.CPU_OP))
    start, end = cols["start"], cols["end"].copy()
    unfinished = np.flatnonzero(end == 0)
    end[unfinished] = np.maximum(stop_ns, start[unfinished])
    tid = cols["tid"]
    threads = sorted_unique(tid)
    thread_rows = np.array([sink.host_thread(t) for t in threads.tolist()], dtype=np.int64)
    ids = ctx.new_correlation_ids(n)
    name_codes = cols["name"]
    args = flows.evaluate_function_args(name_codes, names, seq, fwd_tid, tid)
    keys: tuple[str, ...] = ()
    columns: list = []
    handles = cols["handle"].astype(np.int64)
    if handles.any():  # ids are on (an ExecutionTraceObserver asked for them): torch's "Record function id"
        keys, columns = ("Record function id",), [handles]
    if config.record_shapes or config.with_flops or config.with_modules:
        # formatted by the observer: Sequence number, Fwd thread id, the four shape args, and the
        # extra args (kwargs, flops, Module Hierarchy) of the few ops that have any
        fragments, extra = obs.arg_fragments(n)
        keys += observer.ARG_KEYS
        columns += [JSONColumn(f) for f in fragments]
        for i in [i for i, body in enumerate(extra) if body]:
            args[i] = collective_args({**args.get(i, {}), **orjson.loads(b"{" + extra[i] + b"}")}, job)
    else:
        args.update(flows.sequence_args(np.flatnonzero(seq >= 0), seq, fwd_tid))
        for i, body in obs.extras().items():  # collectives' args, as Kineto writes them
            if i < n:
                args[i] = collective_args({**args.get(i, {}), **orjson.loads(b"{" + body + b"}")}, job)
    hierarchy_keys, hierarchy_columns = _hierarchy_columns(obs, cols)
    keys += hierarchy_keys
    columns += hierarchy_columns
    if config.extra.get("capture_overload_names"):
        name_codes, names = _overload_names(name_codes, cols["overload"], names, args)
    for i in unfinished.tolist():
        args[i] = {**args.get(i, {}), "finished": False}
    flow_id, flow_start = flows.fwdbwd_flows(seq, fwd_tid, cols["rf_tid"], start, ctx, carry,
                                             config.extra.get("fwdbwd_carry_s"))
    sink.activities(
        {
            "kind": kinds,
            "name": CodedStrings(name_codes, names),
            "device": np.full(n, sink.host_device()),
            "resource": thread_rows[np.searchsorted(threads, tid)],
            "start": start,
            "end": end,
            "correlation": ids,
            "external_id": ids,
            "flow_id": flow_id,
            "flow_type": np.where(flow_id != 0, FLOW_FWDBWD, 0),
            "flow_start": flow_start,
        },
        args,
        ArgColumns(keys, tuple(columns)) if keys else None,
    )


def _hierarchy_columns(obs: observer.Observer, cols: dict[str, np.ndarray]) -> tuple[tuple[str, ...], list]:
    """The eager "Module Hierarchy" (with_modules) of each op, from the observer's hierarchy table: one
    JSON value per distinct hierarchy, shared by the ops that ran under it."""
    modules = cols["modules"]
    if not (modules >= 0).any():
        return (), []
    values = [*obs.hierarchies(), b""]  # id -1: the last entry, no such key
    return ("Module Hierarchy",), [JSONColumn([values[i] for i in modules.tolist()])]


def _overload_names(
    codes: np.ndarray, overloads: np.ndarray, names: list[str], args: dict[int, dict]
) -> tuple[np.ndarray, list[str]]:
    """Ops with an overload are named "name.overload", as torch.profiler writes them with
    capture_overload_names, and carry the overload in OVERLOAD_ARG."""
    table = list(names)
    combined: dict[tuple[int, int], int] = {}
    codes = codes.copy()
    for i in np.flatnonzero(overloads >= 0).tolist():
        overload = names[int(overloads[i])]
        if not overload:
            continue
        key = (int(codes[i]), int(overloads[i]))
        code = combined.get(key)
        if code is None:
            code = combined[key] = len(table)
            table.append(f"{names[key[0]]}.{overload}")
        codes[i] = code
        args[i] = {**args.get(i, {}), OVERLOAD_ARG: overload}
    return codes, table


def _memory(memory: dict[str, np.ndarray], sink: Sink) -> None:
    """The allocator's reports as torch.profiler writes them: ``[memory]`` instants (``[OutOfMemory]``
    for a failed allocation) with Total Reserved, Total Allocated, Bytes, Device Id, Device Type, Addr."""
    n = len(memory["ts"])
    tid = memory["tid"]
    threads = sorted_unique(tid)
    thread_rows = np.array([sink.host_thread(t) for t in threads.tolist()], dtype=np.int64)
    oom = memory["ptr"] == 0
    sink.activities(
        {
            "kind": np.full(n, int(ActivityKind.INSTANT)),
            "name": CodedStrings(oom.astype(np.int64), ["[memory]", "[OutOfMemory]"]),
            "device": np.full(n, sink.host_device()),
            "resource": thread_rows[np.searchsorted(threads, tid)],
            "start": memory["ts"],
            "end": memory["ts"],
        },
        arg_columns=ArgColumns(
            ("Total Reserved", "Total Allocated", "Bytes", "Device Id", "Device Type", "Addr"),
            (
                memory["total_reserved"],
                memory["total_allocated"],
                memory["bytes"],
                memory["device_index"],
                memory["device_type"],
                memory["ptr"],
            ),
        ),
    )
