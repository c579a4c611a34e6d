"""One CUDA profiling session: CUPTI activity buffers in, Kineto-shaped activities out.

* prepare: check no other CUPTI subscriber, system thread ids, buffer callbacks, enable activity kinds
  (tracing starts at warm-up, as in Kineto; the engine drops what falls outside the window);
* start/stop: (CUPTI timestamp, host clock) pairs for the clock mapping; stop flushes and disables;
* push/pop_correlation: CUPTI external correlation (CUSTOM0 for ops, CUSTOM1 for annotations);
* the buffer-completed callback copies records into tuples and counts what exceeds the cap;
* collect: names, devices, streams, flows, External ids, Kineto's args.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from typing import Any

import numpy as np

from polyprof.backend import ProfileConfig, SessionContext, Sink
from polyprof.clock import ClockMapping, host_ns
from polyprof.model import FLOW_AC2G, ActivityKind, ArgColumns
from polyprof_cuda.records import (
    DEFAULT_KINDS,
    DRIVER,
    EXTERNAL,
    EXTRACTORS,
    KERNEL,
    KIND_FAMILIES,
    MEMCPY,
    MEMCPY_P2P,
    MEMSET,
    OVERHEAD,
    RUNTIME,
    SYNC,
)

DEFAULT_BUFFER_MB = 8
DEFAULT_MAX_RECORDS = 20_000_000
#: device buffers and profiling-semaphore pools CUPTI allocates per context up front (CUPTI's default: 0)
DEFAULT_PREALLOCATED = 2
#: Runtime/driver calls kept by default: launches, copies, fills, syncs, graph launches.
DEFAULT_API_PATTERN = re.compile(r"Launch|Memcpy|Memset|Synchronize|EventRecord|StreamWait|Graph")
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


def _name_key(r: Any) -> tuple:
    """What a copy's or fill's name depends on."""
    return (
        type(r).__name__,
        getattr(r, "copy_kind", None),
        getattr(r, "src_kind", None),
        getattr(r, "dst_kind", None),
        getattr(r, "memory_kind", None),
    )


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


def _ints(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _transfer_args(rows: list, peer: bool) -> ArgColumns:
    """Kineto's args for copies or fills, as columns (peer copies add the three device ids)."""
    nbytes = np.array([r.bytes for r in rows], dtype=np.int64)
    duration = np.array([r.end - r.start for r in rows], dtype=np.int64)
    bandwidth = np.round(np.divide(nbytes, duration, out=np.zeros(len(rows)), where=duration != 0), 6)
    columns = [
        np.array([r.device for r in rows], dtype=np.int64),
        np.array([r.context for r in rows], dtype=np.int64),
        np.array([r.stream for r in rows], dtype=np.int64),
        np.array([r.correlation for r in rows], dtype=np.int64),
        nbytes,
        bandwidth,
    ]
    if not peer:
        return ArgColumns(TRANSFER_ARG_KEYS, tuple(columns))
    columns += [
        np.array([r.src_device for r in rows], dtype=np.int64),
        np.array([r.device for r in rows], dtype=np.int64),
        np.array([r.dst_device for r in rows], dtype=np.int64),
    ]
    return ArgColumns(TRANSFER_ARG_KEYS + PEER_ARG_KEYS, tuple(columns))


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
        self.raw: dict[str, list[tuple]] = defaultdict(list)
        self.records = 0
        self.dropped_by_cap = 0
        self.callback_errors: list[str] = []
        self.pairs: list[tuple[int, int, int]] = []
        self.tracing = False
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.layer.check_subscriber()
        try:  # before enabling anything: CUPTI applies it when it sets up a context
            self.layer.preallocate(*self.preallocated)
        except Exception as exc:
            self.ctx.report.warning(
                f"CUPTI refused to pre-allocate its buffers ({exc}); it will allocate them while tracing"
            )
        self.layer.use_system_thread_ids()
        self.layer.register_callbacks(self._requested, self._completed)
        if self.latency:
            self.layer.enable_latency_timestamps(True)
        self.layer.enable(self.kinds)
        self.tracing = True
        self._pair()

    def start(self) -> None:
        self._pair()

    def push_correlation(self, ident: int, kind: str) -> None:
        self.layer.push_external(kind, ident)

    def pop_correlation(self, kind: str) -> None:
        self.layer.pop_external(kind)

    def stop(self) -> None:
        if not self.tracing:
            return
        self.tracing = False
        self.layer.flush_all()
        self.layer.disable(self.kinds)
        self._pair()
        dropped = self.layer.dropped_records()
        if dropped:
            self.ctx.report.dropped_records(dropped, "records (CUPTI buffers full)")

    def close(self) -> None:
        self.stop()
        self.raw = defaultdict(list)

    def _pair(self) -> None:
        best = None
        for _ in range(5):
            h0 = host_ns()
            c = self.layer.timestamp()
            h1 = host_ns()
            if best is None or h1 - h0 < best[2]:
                best = (c, (h0 + h1) // 2, h1 - h0)
        assert best is not None
        self.pairs.append((best[0], best[1], max(1, best[2] // 2)))

    # -- CUPTI's thread ---------------------------------------------------------------------------
    def _requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _completed(self, activities: list) -> None:
        """Runs on CUPTI's thread: copy what is needed, never raise into CUPTI."""
        try:
            families, raw = self.families, self.raw
            with self._lock:
                room = self.max_records - self.records
                for r in activities:
                    family = families.get(r.kind)
                    if family is None:
                        continue
                    if room <= 0:
                        self.dropped_by_cap += 1
                        continue
                    raw[family].append(EXTRACTORS[family](r))
                    room -= 1
                self.records = self.max_records - room
        except Exception as exc:  # a record of an unexpected layout: keep going, say so
            if len(self.callback_errors) < 10:
                self.callback_errors.append(f"{type(exc).__name__}: {exc}")

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        for message in self.callback_errors:
            self.ctx.report.error(f"decoding CUPTI records failed: {message}")
        if self.dropped_by_cap:
            self.ctx.report.dropped_records(
                self.dropped_by_cap, f"records over the cap of {self.max_records}"
            )
        mapping = ClockMapping.fit(
            [c for c, _, _ in self.pairs],
            [h for _, h, _ in self.pairs],
            uncertainty_ns=max((u for _, _, u in self.pairs), default=0),
        )
        self.ctx.report.clock_mapping(mapping, "cupti")
        sink.add_metadata("cupti_python_version", self.layer.package_version())
        raw, self.raw = self.raw, defaultdict(list)
        external = self._external_ids(raw.get(EXTERNAL, []))
        to_host = mapping.to_host
        launched = {r.correlation for fam in (KERNEL, MEMCPY, MEMCPY_P2P, MEMSET) for r in raw.get(fam, [])}
        context_device: dict[int, int] = {}
        host = sink.host_device()
        streams: dict[tuple[int, int], int] = {}

        def device_handle(index: int) -> int:
            facts = self.devices.get(index)
            return sink.device(
                f"cuda:{index}",
                type="cuda",
                index=index,
                name=facts.name if facts else f"GPU {index}",
                properties=facts.properties if facts else None,
                pid=index,
                label=f"GPU {index}",
            )

        def stream_row(index: int, stream: int, sync: bool = False) -> tuple[int, int]:
            dev = device_handle(index)
            rid = stream + SYNC_STREAM_OFFSET if sync else stream
            key = (dev, rid)
            if key not in streams:
                streams[key] = sink.resource(dev, rid, f"stream {stream}{' (sync)' if sync else ''}")
            return dev, streams[key]

        def device_work(
            kind: ActivityKind, names: Any, placed: list, starts: Any, ends: Any, corrs: Any, args: ArgColumns
        ) -> None:
            """Kernels, copies or fills in bulk: on their stream rows, with the ac2g flow end and the
            External id of their launch."""
            start_dev = np.array(starts, dtype=np.int64)
            start = to_host(start_dev)
            sink.activities(
                {
                    "kind": np.full(len(placed), int(kind)),
                    "name": names,
                    "device": [p[0] for p in placed],
                    "resource": [p[1] for p in placed],
                    "start": start,
                    "end": start + (np.array(ends, dtype=np.int64) - start_dev),
                    "correlation": corrs,
                    "external_id": [external.get(k, 0) for k in corrs],
                    "flow_id": corrs,
                    "flow_type": np.full(len(placed), FLOW_AC2G),
                },
                arg_columns=args,
            )

        kernels = raw.get(KERNEL, [])
        if kernels:  # column by column: the bulk of a CUDA trace
            (
                names,
                starts,
                ends,
                queued,
                devs,
                ctxs,
                strms,
                corrs,
                regs,
                smem,
                grids,
                blocks,
                graph_ids,
                graph_nodes,
                channels,
                channel_types,
            ) = zip(*kernels, strict=True)
            for c, d in zip(ctxs, devs, strict=True):
                context_device[c] = d
            rows = {key: stream_row(*key) for key in set(zip(devs, strms, strict=True))}
            placed = [rows[key] for key in zip(devs, strms, strict=True)]
            start_col, queued_col = np.array(starts, dtype=np.int64), np.array(queued, dtype=np.int64)
            queued_us = (
                np.where(queued_col != 0, (start_col - queued_col) / 1000.0, 0.0)
                if self.latency
                else np.zeros(len(kernels), dtype=np.int64)
            )
            # one column per key (no dict per kernel); grid and block stay tuples, written as JSON arrays
            args = ArgColumns(
                KERNEL_ARG_KEYS,
                (
                    queued_us,
                    *map(_ints, (devs, ctxs, strms, corrs, regs, smem)),
                    grids,
                    blocks,
                    *map(_ints, (graph_ids, graph_nodes, channels, channel_types)),
                ),
            )
            device_work(ActivityKind.KERNEL, names, placed, starts, ends, corrs, args)

        def transfers(rows: list, kind: ActivityKind, name_of: Any, peer: bool = False) -> None:
            """Copies or fills, added in bulk like kernels (names computed once per distinct kind)."""
            if not rows:
                return
            name_by_key: dict[tuple, str] = {}
            names, placed = [], []
            for r in rows:
                context_device[r.context] = r.device
                placed.append(stream_row(r.device, r.stream))
                key = _name_key(r)
                if key not in name_by_key:
                    name_by_key[key] = name_of(r)
                names.append(name_by_key[key])
            device_work(
                kind,
                names,
                placed,
                [r.start for r in rows],
                [r.end for r in rows],
                [r.correlation for r in rows],
                _transfer_args(rows, peer),
            )

        transfers(raw.get(MEMCPY, []), ActivityKind.GPU_MEMCPY, self._memcpy_name)
        transfers(raw.get(MEMCPY_P2P, []), ActivityKind.GPU_MEMCPY, self._memcpy_name, peer=True)
        transfers(raw.get(MEMSET, []), ActivityKind.GPU_MEMSET, self._memset_name)
        for family, kind, cat, domain in (
            (RUNTIME, ActivityKind.RUNTIME, "cuda_runtime", "runtime"),
            (DRIVER, ActivityKind.DRIVER, "cuda_driver", "driver"),
        ):
            calls = raw.get(family, [])
            if not calls:
                continue
            cbids, starts, ends, tids, corrs = zip(*calls, strict=True)
            names = {cbid: self.layer.callback_name(domain, cbid) for cbid in set(cbids)}
            wanted = {
                cbid for cbid, name in names.items() if self.all_apis or DEFAULT_API_PATTERN.search(name)
            }
            keep = [
                i
                for i, (cbid, corr) in enumerate(zip(cbids, corrs, strict=True))
                if cbid in wanted or corr in launched
            ]
            if not keep:
                continue
            threads = {tid: sink.host_thread(tid) for tid in {tids[i] for i in keep}}
            start_dev = np.array([starts[i] for i in keep], dtype=np.int64)
            start = to_host(start_dev)
            kept_corr = [corrs[i] for i in keep]
            flows = [c if c in launched else 0 for c in kept_corr]
            sink.activities(
                {
                    "kind": np.full(len(keep), int(kind)),
                    "name": [names[cbids[i]] for i in keep],
                    "cat": [cat] * len(keep),
                    "device": np.full(len(keep), host),
                    "resource": [threads[tids[i]] for i in keep],
                    "start": start,
                    "end": start + (np.array([ends[i] for i in keep], dtype=np.int64) - start_dev),
                    "correlation": kept_corr,
                    "external_id": [external.get(c, 0) for c in kept_corr],
                    "flow_id": flows,
                    "flow_type": [FLOW_AC2G if f else 0 for f in flows],
                    "flow_start": [1 if f else 0 for f in flows],
                },
                arg_columns=ArgColumns(
                    ("cbid", "correlation"),
                    (np.array([cbids[i] for i in keep], dtype=np.int64), np.array(kept_corr, dtype=np.int64)),
                ),
            )
        for r in raw.get(SYNC, []):
            index = context_device.get(r.context, 0)
            dev, row = stream_row(index, max(r.stream, 0), sync=True)
            start = to_host(r.start)
            sync_type = self.layer.enum_name("ActivitySynchronizationType", r.type)
            sink.activity(
                ActivityKind.SYNC,
                SYNC_NAMES.get(sync_type, "Sync"),
                device=dev,
                resource=row,
                start=start,
                end=start + (r.end - r.start),
                cat="cuda_sync",
                correlation=r.correlation,
                external_id=external.get(r.correlation, 0),
                args={
                    "cuda_sync_kind": sync_type,
                    "stream": r.stream,
                    "correlation": r.correlation,
                    "device": index,
                    "context": r.context,
                    "wait_on_cuda_event_id": r.cuda_event,
                },
            )
        overhead_rows = raw.get(OVERHEAD, [])
        if overhead_rows:
            dev = sink.device(
                "cupti-overhead", type="overhead", index=0, name="CUPTI Overhead", sort_index=0x100000, pid=-1
            )
            row = sink.resource(dev, 0, "overhead")
            for r in overhead_rows:
                start = to_host(r.start)
                name = self.layer.enum_name("ActivityOverheadKind", r.overhead_kind)
                sink.activity(
                    ActivityKind.OVERHEAD,
                    name.replace("_", " ").title(),
                    device=dev,
                    resource=row,
                    start=start,
                    end=start + (r.end - r.start),
                )

    def _external_ids(self, externals: list) -> dict[int, int]:
        """CUPTI correlation id -> External id: the framework op (CUSTOM0) when there is one, else the
        innermost annotation (CUSTOM1)."""
        op_kind = self.layer.external_kind_value("op")
        annotation_kind = self.layer.external_kind_value("annotation")
        ops: dict[int, int] = {}
        annotations: dict[int, int] = {}
        for r in externals:
            if r.external_kind == op_kind:
                ops[r.correlation] = r.external_id
            elif r.external_kind == annotation_kind:
                annotations[r.correlation] = r.external_id
        return {**annotations, **ops}

    def _memset_name(self, r: Any) -> str:
        kind = MEMORY_KIND_NAMES.get(self.layer.enum_name("ActivityMemoryKind", r.memory_kind), "Device")
        return f"Memset ({kind})"

    def _memcpy_name(self, r: Any) -> str:
        copy = self.layer.enum_name("ActivityMemcpyKind", r.copy_kind)
        src = MEMORY_KIND_NAMES.get(self.layer.enum_name("ActivityMemoryKind", r.src_kind), "?")
        dst = MEMORY_KIND_NAMES.get(self.layer.enum_name("ActivityMemoryKind", r.dst_kind), "?")
        return f"Memcpy {copy.replace('TO', 'to')} ({src} -> {dst})"
