"""One CUDA profiling session: CUPTI activity buffers in, Kineto-shaped activities out.

* prepare: check no other CUPTI subscriber, system thread ids, buffer callbacks, enable activity kinds
  (tracing starts at warm-up, as in Kineto; the engine drops what falls outside the window);
* start/stop: (CUPTI timestamp, host clock) pairs for the clock mapping; stop flushes and disables;
* push/pop_correlation: CUPTI external correlation (CUSTOM0 for ops, CUSTOM1 for annotations);
* the buffer-completed callback keeps the records cupti-python hands it (O(1) per buffer, so CUPTI's
  thread holds the GIL for as little as possible while the program runs) and counts what exceeds the cap;
* collect: records -> columns (records.decode), then names, devices, streams, flows, External ids and
  Kineto's args, column by column.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import numpy as np

from polyprof.plugin import (
    CUPTI,
    FLOW_AC2G,
    ActivityKind,
    ArgColumns,
    ClockPairs,
    CodedStrings,
    ProfileConfig,
    SessionContext,
    Sink,
)
from polyprof.plugin.records import demangled, demangler_problem, sorted_unique
from polyprof_cuda.cupti_layer import UNNAMED_SUBSCRIBER, SubscriberHeld
from polyprof_cuda.raw_buffers import BufferPool
from polyprof_cuda.records import (
    DEFAULT_KINDS,
    DRIVER,
    EXTERNAL,
    KERNEL,
    KIND_FAMILIES,
    MEMCPY,
    MEMCPY_P2P,
    MEMSET,
    OVERHEAD,
    RUNTIME,
    SYNC,
    TIMESTAMP_UNKNOWN,
    Decoded,
    decode,
)

DEFAULT_BUFFER_MB = 8
DEFAULT_MAX_RECORDS = 20_000_000
#: device buffers and profiling-semaphore pools CUPTI allocates per context up front (CUPTI's default: 0)
DEFAULT_PREALLOCATED = 2


def torch_profiler_state() -> str:
    """ "polyprof's" while a polyprof profile records ops through torch's collector, "running" while
    torch's profiler runs on its own, "idle" when torch is loaded and its profiler is off, "" without
    torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    if SessionContext.facility_holder(CUPTI) == "torch":
        return "polyprof's"
    try:
        return "running" if torch._C._autograd._profiler_enabled() else "idle"
    except Exception:
        return ""


#: Pools whose buffers CUPTI never handed back: kept alive, since CUPTI may still write into them.
_LENT_FOREVER: list[BufferPool] = []
#: Runtime/driver calls kept by default: launches, copies, fills, syncs, graph launches.
DEFAULT_API_PATTERN = re.compile(r"Launch|Memcpy|Memset|Synchronize|EventRecord|StreamWait|Graph")
INVALID_ID = 0xFFFFFFFF  # CUPTI_SYNCHRONIZATION_INVALID_VALUE in a uint32 field
SYNC_STREAM_OFFSET = 1_000_000  # Kineto's kSyncStreamTidOffset: "stream N (sync)" rows
SYNC_NAMES = {
    "EVENT_SYNCHRONIZE": "Event Sync",
    "STREAM_WAIT_EVENT": "Stream Wait Event",
    "STREAM_SYNCHRONIZE": "Stream Sync",
    "CONTEXT_SYNCHRONIZE": "Context Sync",
}
MEMORY_KIND_NAMES = {
    "PAGEABLE": "Pageable",
    "PINNED": "Pinned",
    "DEVICE": "Device",
    "ARRAY": "Array",
    "MANAGED": "Managed",
    "DEVICE_STATIC": "Device Static",
    "MANAGED_STATIC": "Managed Static",
}


KERNEL_ARG_KEYS = (
    "queued",
    "device",
    "context",
    "stream",
    "correlation",
    "registers per thread",
    "shared memory",
    "grid",
    "block",
    "graph id",
    "graph node id",
    "channel",
    "channel_type",
)
TRANSFER_ARG_KEYS = ("device", "context", "stream", "correlation", "bytes", "memory bandwidth (GB/s)")
PEER_ARG_KEYS = ("fromDevice", "inDevice", "toDevice")


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[i] where keys[i] == query, else 0, for each query (keys sorted and distinct)."""
    if not len(keys):
        return np.zeros(len(query), dtype=np.int64)
    at = np.clip(np.searchsorted(keys, query), 0, len(keys) - 1)
    return np.where(keys[at] == query, values[at], 0)


def _transfer_args(cols: dict, peer: bool) -> ArgColumns:
    """Kineto's args for copies or fills, as columns (peer copies add the three device ids)."""
    nbytes = cols["bytes"]
    duration = cols["end"] - cols["start"]
    bandwidth = np.round(np.divide(nbytes, duration, out=np.zeros(len(nbytes)), where=duration != 0), 6)
    columns = [
        cols["device_id"],
        cols["context_id"],
        cols["stream_id"],
        cols["correlation_id"],
        nbytes,
        bandwidth,
    ]
    if not peer:
        return ArgColumns(TRANSFER_ARG_KEYS, tuple(columns))
    columns += [cols["src_device_id"], cols["device_id"], cols["dst_device_id"]]
    return ArgColumns(TRANSFER_ARG_KEYS + PEER_ARG_KEYS, tuple(columns))


def _dim3(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> list[tuple[int, int, int]]:
    """Grid or block sizes as (x, y, z) tuples, one shared tuple per distinct size."""
    if not len(x):
        return []
    order = np.lexsort((z, y, x))
    xs, ys, zs = x[order], y[order], z[order]
    new = np.ones(len(x), dtype=bool)
    new[1:] = (xs[1:] != xs[:-1]) | (ys[1:] != ys[:-1]) | (zs[1:] != zs[:-1])
    table = list(zip(xs[new].tolist(), ys[new].tolist(), zs[new].tolist(), strict=True))
    inverse = np.empty(len(x), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return [table[i] for i in inverse.tolist()]


class CudaSession:
    def __init__(self, layer: Any, devices: list, config: ProfileConfig, ctx: SessionContext) -> None:
        self.layer = layer
        self.devices = {d.index: d for d in devices}
        self.ctx = ctx
        opts = ctx.options
        self.kinds = list(opts.get("kinds", DEFAULT_KINDS))
        self.buffer_bytes = int(opts.get("buffer_size_mb", DEFAULT_BUFFER_MB)) << 20
        self.max_records = int(opts.get("max_records", DEFAULT_MAX_RECORDS))
        self.all_apis = opts.get("apis", "default") == "all"
        self.latency = bool(opts.get("latency_timestamps", False))
        self.preallocated = (
            int(opts.get("preallocate_device_buffers", DEFAULT_PREALLOCATED)),
            int(opts.get("preallocate_semaphore_pools", DEFAULT_PREALLOCATED)),
        )
        self.families = {layer.kind_value(k): KIND_FAMILIES[k] for k in self.kinds}
        self.layouts = layer.layouts()
        largest = max((dtype.itemsize for _, dtype in self.layouts.values()), default=256)
        # raw buffers kept until collect; their memory is bounded by what max_records of them can need
        self.pool = BufferPool(self.buffer_bytes, max_bytes=self.max_records * largest)
        self.pairs = ClockPairs()
        self.tracing = False
        self.kineto_alongside = False
        self.decoded = Decoded()

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        try:
            self.layer.check_subscriber()
        except SubscriberHeld as exc:
            state = torch_profiler_state()
            if UNNAMED_SUBSCRIBER not in exc.holder or state not in ("idle", "polyprof's"):
                raise
            # torch's Kineto stays subscribed once torch's profiler has run; it traces nothing now
            self.ctx.report.detail(
                "CUPTI subscriber", f"torch's profiler ({state}) holds it; polyprof traces"
            )
        # before enabling anything: CUPTI applies these when it sets up a context
        for attribute, error in self.layer.preallocate(*self.preallocated).items():
            self.ctx.report.detail(f"CUPTI did not pre-allocate ({attribute})", error)
        mangled = demangler_problem()
        if mangled:
            self.ctx.report.warning(f"kernel names will stay mangled: {mangled}")
        self.layer.use_system_thread_ids()
        self.layer.register_buffer_callbacks(self.pool.requested, self.pool.completed)
        if self.latency:
            self.layer.enable_latency_timestamps(True)
        self.layer.enable(self.kinds)
        self.tracing = True
        self._pair()

    def start(self) -> None:
        if torch_profiler_state() == "polyprof's":
            self._take_cupti_back()
        self._pair()

    def _take_cupti_back(self) -> None:
        """torch's collector, started by this profile's torch backend just before, took CUPTI's buffer
        callbacks and enabled runtime/driver tracing (torch's ``kCpuTypes``): take the callbacks back for
        this profile (it stops first, last started), and ignore the external ids Kineto pushes."""
        self.kineto_alongside = True
        try:
            self.layer.register_buffer_callbacks(self.pool.requested, self.pool.completed)
            self.layer.enable(self.kinds)
        except Exception as exc:
            self.ctx.report.warning(f"could not take CUPTI back from torch's collector: {exc}")
        self.pairs.clear()  # Kineto may have given CUPTI its own clock: pair from here on
        self.ctx.report.detail("alongside", "torch's collector (Kineto), whose CUPTI callbacks polyprof took")

    def push_correlation(self, ident: int, kind: str) -> None:
        self.layer.push_external(kind, ident)

    def pop_correlation(self, kind: str) -> None:
        self.layer.pop_external(kind)

    def stop(self) -> None:
        if not self.tracing:
            return
        self.tracing = False
        started = time.perf_counter()
        self.layer.flush_all()
        self.layer.disable(self.kinds)
        flushed = time.perf_counter()
        self._pair()
        dropped = self.layer.dropped_records()
        if dropped:
            self.ctx.report.dropped_records(dropped, "records (CUPTI buffers full)")
        # decoded now, while CUPTI (whose memory kernel names point into) is certainly alive: a
        # profiler stopped after this one (torch's Kineto) may finalize CUPTI
        buffers = self.pool.take()
        decode_started = time.perf_counter()
        try:
            self.decoded = decode(
                buffers, self.families, self.layouts, self.layer.next_record, self.max_records
            )
        except Exception as exc:  # a malformed buffer: say so at collect; the other backends go on
            self.decoded = Decoded()
            self.decoded.problems.append(f"{type(exc).__name__}: {exc}")
        done = time.perf_counter()
        # CUPTI's share of the stop (flush, disable) and polyprof's (walking and decoding the records)
        self.ctx.report.detail(
            "stop_ms",
            {
                "cupti_flush": round((flushed - started) * 1e3, 3),
                "decode": round((done - decode_started) * 1e3, 3),
            },
        )

    def close(self) -> None:
        self.stop()
        self.layer.unregister_buffer_callbacks()
        if self.pool.lent:  # CUPTI still holds some (a flush that failed): their memory must outlive us
            _LENT_FOREVER.append(self.pool)
        self.pool = BufferPool(self.buffer_bytes, 0)

    def _pair(self) -> None:
        self.pairs.sample(self.layer.timestamp)

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        mapping = self.pairs.fit()
        self.ctx.report.clock_mapping(mapping, "cupti")
        sink.add_metadata("cupti_python_version", self.layer.package_version())
        pool = self.pool
        if pool.dropped_buffers:
            self.ctx.report.dropped_records(
                pool.dropped_buffers,
                f"CUPTI buffers ({pool.dropped_bytes >> 20} MiB of records) over the memory that "
                f"max_records={self.max_records} allows",
            )
        decoded, self.decoded = self.decoded, Decoded()
        if self.kineto_alongside:  # Kineto's pushed ids, not polyprof's: launches are linked by time
            decoded.columns.pop(EXTERNAL, None)
        if decoded.over_cap:
            self.ctx.report.dropped_records(decoded.over_cap, f"records over the cap of {self.max_records}")
        for problem in decoded.problems:
            self.ctx.report.error(f"decoding CUPTI records failed: {problem}")
        _CollectPass(self, sink, decoded.columns, mapping.to_host).run()

    def _external_ids(self, externals: dict | None) -> tuple[np.ndarray, np.ndarray]:
        """(CUPTI correlation ids, sorted; their External ids): the framework op (CUSTOM0) when there is
        one, else the innermost annotation (CUSTOM1)."""
        if not externals or not len(externals["correlation_id"]):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        op_kind = self.layer.external_kind_value("op")
        annotation_kind = self.layer.external_kind_value("annotation")
        kind, corr, ext = externals["external_kind"], externals["correlation_id"], externals["external_id"]
        wanted = (kind == op_kind) | (kind == annotation_kind)
        kind, corr, ext = kind[wanted], corr[wanted], ext[wanted]
        # ops after annotations, so that for a correlation id with both the op comes last and wins
        order = np.lexsort(((kind == op_kind).astype(np.int8), corr))
        corr, ext = corr[order], ext[order]
        last = np.ones(len(corr), dtype=bool)
        last[:-1] = corr[1:] != corr[:-1]
        return corr[last], ext[last]

    def _memset_name(self, memory_kind: int) -> str:
        kind = MEMORY_KIND_NAMES.get(self.layer.enum_name("ActivityMemoryKind", memory_kind), "Device")
        return f"Memset ({kind})"

    def _memcpy_name(self, copy_kind: int, src_kind: int, dst_kind: int) -> str:
        copy = self.layer.enum_name("ActivityMemcpyKind", copy_kind)
        src = MEMORY_KIND_NAMES.get(self.layer.enum_name("ActivityMemoryKind", src_kind), "?")
        dst = MEMORY_KIND_NAMES.get(self.layer.enum_name("ActivityMemoryKind", dst_kind), "?")
        return f"Memcpy {copy.replace('TO', 'to')} ({src} -> {dst})"


def _coded_by_key(keys: np.ndarray, name_of: Any) -> CodedStrings:
    """A name per distinct row key (a few per trace), computed once each."""
    distinct = sorted_unique(keys)
    return CodedStrings(np.searchsorted(distinct, keys), [name_of(int(k)) for k in distinct.tolist()])


class _CollectPass:
    """One collect: the decoded columns -> the sink's activities, devices and rows."""

    def __init__(self, session: CudaSession, sink: Sink, cols: dict, to_host: Any) -> None:
        self.s, self.sink, self.cols, self.to_host = session, sink, cols, to_host
        self.ext_keys, self.ext_values = session._external_ids(cols.get(EXTERNAL))
        device_corrs = [cols[f]["correlation_id"] for f in (KERNEL, MEMCPY, MEMCPY_P2P, MEMSET) if f in cols]
        self.launched = sorted_unique(np.concatenate(device_corrs)) if device_corrs else np.zeros(0, np.int64)
        self.context_device: dict[int, int] = {}
        self.streams: dict[tuple[int, int], int] = {}

    def run(self) -> None:
        cols = self.cols
        if KERNEL in cols:
            self.kernels(cols[KERNEL])
        for family, peer in ((MEMCPY, False), (MEMCPY_P2P, True)):
            if family in cols:
                c = cols[family]
                keys = (c["copy_kind"] << 32) | (c["src_kind"] << 16) | c["dst_kind"]
                names = _coded_by_key(
                    keys, lambda k: self.s._memcpy_name(k >> 32, (k >> 16) & 0xFFFF, k & 0xFFFF)
                )
                self.device_work(ActivityKind.GPU_MEMCPY, names, c, _transfer_args(c, peer))
        if MEMSET in cols:
            c = cols[MEMSET]
            names = _coded_by_key(c["memory_kind"], self.s._memset_name)
            self.device_work(ActivityKind.GPU_MEMSET, names, c, _transfer_args(c, False))
        for family, kind, cat, domain in (
            (RUNTIME, ActivityKind.RUNTIME, "cuda_runtime", "runtime"),
            (DRIVER, ActivityKind.DRIVER, "cuda_driver", "driver"),
        ):
            if family in cols:
                self.api_calls(cols[family], kind, cat, domain)
        if SYNC in cols:
            self.syncs(cols[SYNC])
        if OVERHEAD in cols:
            self.overheads(cols[OVERHEAD])

    # -- devices and rows ---------------------------------------------------------------------------
    def device_handle(self, index: int) -> int:
        facts = self.s.devices.get(index)
        return self.sink.device(
            f"cuda:{index}",
            type="cuda",
            index=index,
            name=facts.name if facts else f"GPU {index}",
            properties=facts.properties if facts else None,
            pid=index,
            label=f"GPU {index}",
        )

    def stream_row(self, index: int, stream: int, sync: bool = False) -> tuple[int, int]:
        dev = self.device_handle(index)
        rid = stream + SYNC_STREAM_OFFSET if sync else stream
        key = (dev, rid)
        if key not in self.streams:
            self.streams[key] = self.sink.resource(dev, rid, f"stream {stream}{' (sync)' if sync else ''}")
        return dev, self.streams[key]

    def placed(self, c: dict) -> tuple[np.ndarray, np.ndarray]:
        """(device handle, stream row) per row, creating each distinct device and stream once."""
        devs, streams, ctxs = c["device_id"], c["stream_id"], c["context_id"]
        for ctx_id, dev in set(zip(ctxs.tolist(), devs.tolist(), strict=True)):
            self.context_device[ctx_id] = dev
        keys = (devs << 32) | streams
        distinct = sorted_unique(keys)
        rows = [self.stream_row(int(k >> 32), int(k & 0xFFFFFFFF)) for k in distinct.tolist()]
        at = np.searchsorted(distinct, keys)
        return (
            np.array([r[0] for r in rows], dtype=np.int64)[at],
            np.array([r[1] for r in rows], dtype=np.int64)[at],
        )

    def external(self, corrs: np.ndarray) -> np.ndarray:
        return _lookup(self.ext_keys, self.ext_values, corrs)

    # -- families -----------------------------------------------------------------------------------
    def device_work(self, kind: ActivityKind, names: Any, c: dict, args: ArgColumns) -> None:
        """Kernels, copies or fills in bulk: on their stream rows, with the ac2g flow end and the
        External id of their launch."""
        device, resource = self.placed(c)
        start = self.to_host(c["start"])
        corrs = c["correlation_id"]
        n = len(corrs)
        self.sink.activities(
            {
                "kind": np.full(n, int(kind)),
                "name": names,
                "device": device,
                "resource": resource,
                "start": start,
                "end": start + (c["end"] - c["start"]),
                "correlation": corrs,
                "external_id": self.external(corrs),
                "flow_id": corrs,
                "flow_type": np.full(n, FLOW_AC2G),
            },
            arg_columns=args,
        )

    def kernels(self, c: dict) -> None:
        start = c["start"]
        queued = c["queued"]  # 0 or CUPTI_TIMESTAMP_UNKNOWN unless latency timestamps are on
        known = (queued != 0) & (queued != TIMESTAMP_UNKNOWN)
        queued_us = (
            np.where(known, (start - queued) / 1000.0, 0.0)
            if self.s.latency
            else np.zeros(len(start), dtype=np.int64)
        )
        args = ArgColumns(
            KERNEL_ARG_KEYS,
            (
                queued_us,
                c["device_id"],
                c["context_id"],
                c["stream_id"],
                c["correlation_id"],
                c["registers_per_thread"],
                c["static_shared_memory"] + c["dynamic_shared_memory"],
                _dim3(c["grid_x"], c["grid_y"], c["grid_z"]),
                _dim3(c["block_x"], c["block_y"], c["block_z"]),
                c["graph_id"],
                c["graph_node_id"],
                c["channel_id"],
                c["channel_type"],
            ),
        )
        self.device_work(ActivityKind.KERNEL, demangled(c["name"]), c, args)

    def api_calls(self, c: dict, kind: ActivityKind, cat: str, domain: str) -> None:
        cbids, corrs = c["cbid"], c["correlation_id"]
        distinct = sorted_unique(cbids)
        names = [self.s.layer.callback_name(domain, cbid) for cbid in distinct.tolist()]
        wanted = np.array(
            [self.s.all_apis or bool(DEFAULT_API_PATTERN.search(name)) for name in names], dtype=bool
        )
        code = np.searchsorted(distinct, cbids)
        is_launch = np.isin(corrs, self.launched)
        keep = np.flatnonzero(wanted[code] | is_launch)
        if not len(keep):
            return
        tids = c["thread_id"][keep]
        distinct_tids = sorted_unique(tids)
        rows = np.array([self.sink.host_thread(int(t)) for t in distinct_tids.tolist()], dtype=np.int64)
        start_dev = c["start"][keep]
        start = self.to_host(start_dev)
        kept_corr = corrs[keep]
        flows = np.where(is_launch[keep], kept_corr, 0)
        n = len(keep)
        self.sink.activities(
            {
                "kind": np.full(n, int(kind)),
                "name": CodedStrings(code[keep], names),
                "cat": CodedStrings(np.zeros(n, dtype=np.int64), [cat]),
                "device": np.full(n, self.sink.host_device()),
                "resource": rows[np.searchsorted(distinct_tids, tids)],
                "start": start,
                "end": start + (c["end"][keep] - start_dev),
                "correlation": kept_corr,
                "external_id": self.external(kept_corr),
                "flow_id": flows,
                "flow_type": np.where(flows != 0, FLOW_AC2G, 0),
                "flow_start": (flows != 0).astype(np.int64),
            },
            arg_columns=ArgColumns(("cbid", "correlation"), (cbids[keep], kept_corr)),
        )

    def syncs(self, c: dict) -> None:
        externals = self.external(c["correlation_id"]).tolist()
        rows = zip(
            c["type"].tolist(),
            c["start"].tolist(),
            c["end"].tolist(),
            c["context_id"].tolist(),
            c["stream_id"].tolist(),
            c["correlation_id"].tolist(),
            c["cuda_event_id"].tolist(),
            externals,
            strict=True,
        )
        for sync_type_value, t0, t1, ctx_id, stream, corr, event, ext in rows:
            # CUPTI_SYNCHRONIZATION_INVALID_VALUE (-1 as uint32): no stream (a context sync) or no event
            stream = -1 if stream == INVALID_ID else stream
            event = -1 if event == INVALID_ID else event
            index = self.context_device.get(ctx_id, 0)
            dev, row = self.stream_row(index, max(stream, 0), sync=True)
            start = int(self.to_host(t0))
            sync_type = self.s.layer.enum_name("ActivitySynchronizationType", sync_type_value)
            self.sink.activity(
                ActivityKind.SYNC,
                SYNC_NAMES.get(sync_type, "Sync"),
                device=dev,
                resource=row,
                start=start,
                end=start + (t1 - t0),
                cat="cuda_sync",
                correlation=corr,
                external_id=ext,
                args={
                    "cuda_sync_kind": sync_type,
                    "stream": stream,
                    "correlation": corr,
                    "device": index,
                    "context": ctx_id,
                    "wait_on_cuda_event_id": event,
                },
            )

    def overheads(self, c: dict) -> None:
        dev = self.sink.device(
            "cupti-overhead", type="overhead", index=0, name="CUPTI Overhead", sort_index=0x100000, pid=-1
        )
        row = self.sink.resource(dev, 0, "overhead")
        for kind_value, t0, t1 in zip(
            c["overhead_kind"].tolist(), c["start"].tolist(), c["end"].tolist(), strict=True
        ):
            start = int(self.to_host(t0))
            name = self.s.layer.enum_name("ActivityOverheadKind", kind_value)
            self.sink.activity(
                ActivityKind.OVERHEAD,
                name.replace("_", " ").title(),
                device=dev,
                resource=row,
                start=start,
                end=start + (t1 - t0),
            )
