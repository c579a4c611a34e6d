"""One XPU profiling session over PTI's View API.

PTI calls back on its own thread: ``_requested`` hands it a buffer, ``_completed`` copies the records
out of a filled buffer into named tuples (the ABI's field names) and releases it. Both are short, hold no lock PTI could wait on,
and never let an exception reach C. Records are turned into activities at collect time.
"""

from __future__ import annotations

import ctypes
import operator
import threading
import time
from collections import defaultdict, namedtuple
from typing import Any

from polyprof.plugin import (
    ActivityKind,
    ClockPairs,
    ProfileConfig,
    SessionContext,
    Sink,
)
from polyprof_xpu import abi

DEFAULT_VIEWS = {
    "kernel": abi.VIEW_DEVICE_GPU_KERNEL,
    "memcpy": abi.VIEW_DEVICE_GPU_MEM_COPY,
    "memcpy_p2p": abi.VIEW_DEVICE_GPU_MEM_COPY_P2P,
    "memset": abi.VIEW_DEVICE_GPU_MEM_FILL,
    "runtime": abi.VIEW_RUNTIME_API,
    "driver": abi.VIEW_DRIVER_API,
    "sync": abi.VIEW_DEVICE_SYNCHRONIZATION,
    "external_correlation": abi.VIEW_EXTERNAL_CORRELATION,
    "overhead": abi.VIEW_COLLECTION_OVERHEAD,
}
OPTIONAL_VIEWS = {"communication": abi.VIEW_COMMUNICATION}
ALL_VIEWS = {**DEFAULT_VIEWS, **OPTIONAL_VIEWS}
DEFAULT_BUFFER_KB = 4096  # Kineto's XPU plugin uses 4 MiB buffers
DEFAULT_MAX_BUFFERS = 1024  # per session: 4 GiB of records at the default size

_KERNEL_FIELDS = (
    "_name",
    "_queue_handle",
    "_context_handle",
    "_sycl_queue_id",
    "_kernel_id",
    "_correlation_id",
    "_thread_id",
    "_pci_address",
    "_device_uuid",
    "_append_timestamp",
    "_start_timestamp",
    "_end_timestamp",
    "_submit_timestamp",
    "_sycl_task_begin_timestamp",
)
_COPY_FIELDS = (
    "_name",
    "_queue_handle",
    "_context_handle",
    "_sycl_queue_id",
    "_mem_op_id",
    "_correlation_id",
    "_thread_id",
    "_pci_address",
    "_device_uuid",
    "_append_timestamp",
    "_start_timestamp",
    "_end_timestamp",
    "_submit_timestamp",
    "_bytes",
    "_memcpy_type",
    "_mem_src",
    "_mem_dst",
)
_P2P_FIELDS = (
    "_name",
    "_queue_handle",
    "_context_handle",
    "_sycl_queue_id",
    "_mem_op_id",
    "_correlation_id",
    "_thread_id",
    "_src_pci_address",
    "_src_uuid",
    "_append_timestamp",
    "_start_timestamp",
    "_end_timestamp",
    "_submit_timestamp",
    "_bytes",
    "_memcpy_type",
    "_mem_src",
    "_mem_dst",
    "_dst_pci_address",
)
_FILL_FIELDS = (
    "_name",
    "_queue_handle",
    "_context_handle",
    "_sycl_queue_id",
    "_mem_op_id",
    "_correlation_id",
    "_thread_id",
    "_pci_address",
    "_device_uuid",
    "_append_timestamp",
    "_start_timestamp",
    "_end_timestamp",
    "_submit_timestamp",
    "_bytes",
    "_mem_type",
    "_value_for_set",
)
_ENGINE_FIELDS = ("_engine_ordinal", "_engine_index")
_EXTRACT = {
    abi.VIEW_DEVICE_GPU_KERNEL: _KERNEL_FIELDS,
    abi.VIEW_DEVICE_GPU_MEM_COPY: _COPY_FIELDS,
    abi.VIEW_DEVICE_GPU_MEM_COPY_P2P: _P2P_FIELDS,
    abi.VIEW_DEVICE_GPU_MEM_FILL: _FILL_FIELDS,
    abi.VIEW_RUNTIME_API: (
        "_start_timestamp",
        "_end_timestamp",
        "_api_group",
        "_api_id",
        "_thread_id",
        "_correlation_id",
        "_return_code",
    ),
    abi.VIEW_DRIVER_API: (
        "_start_timestamp",
        "_end_timestamp",
        "_api_group",
        "_api_id",
        "_thread_id",
        "_correlation_id",
        "_return_code",
    ),
    abi.VIEW_DEVICE_SYNCHRONIZATION: (
        "_synch_type",
        "_start_timestamp",
        "_end_timestamp",
        "_thread_id",
        "_correlation_id",
        "_api_group",
        "_api_id",
        "_queue_handle",
    ),
    abi.VIEW_EXTERNAL_CORRELATION: ("_correlation_id", "_external_id", "_external_kind"),
    abi.VIEW_COLLECTION_OVERHEAD: (
        "_overhead_start_timestamp_ns",
        "_overhead_end_timestamp_ns",
        "_overhead_thread_id",
        "_overhead_count",
        "_overhead_kind",
    ),
    abi.VIEW_COMMUNICATION: (
        "_start_timestamp",
        "_end_timestamp",
        "_thread_id",
        "_send_size",
        "_recv_size",
        "_communicator_id",
        "_name",
    ),
}
_DEVICE_KINDS = (
    abi.VIEW_DEVICE_GPU_KERNEL,
    abi.VIEW_DEVICE_GPU_MEM_COPY,
    abi.VIEW_DEVICE_GPU_MEM_COPY_P2P,
    abi.VIEW_DEVICE_GPU_MEM_FILL,
)


def _pci(record: Any) -> str:
    """The PCI address of a device record's device (a peer-to-peer copy's: its source)."""
    return _text(record.src_pci_address if hasattr(record, "src_pci_address") else record.pci_address)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return "" if value is None else str(value)


class XpuSession:
    def __init__(
        self, lib: Any, config: ProfileConfig, ctx: SessionContext, loaded_after_sycl: bool = False
    ) -> None:
        self.lib = lib
        self.ctx = ctx
        opts = ctx.options
        self.views = {name: ALL_VIEWS[name] for name in opts.get("views", DEFAULT_VIEWS)}
        self.buffer_bytes = int(opts.get("buffer_kb", DEFAULT_BUFFER_KB)) << 10
        self.max_buffers = int(opts.get("max_buffers", DEFAULT_MAX_BUFFERS))
        self.all_runtime_apis = opts.get("runtime_apis", "gpu_operations") == "all"
        self.loaded_after_sycl = loaded_after_sycl
        getters, rows = {}, {}
        for kind, fields in _EXTRACT.items():
            if lib.v2 and kind in _DEVICE_KINDS:
                fields = fields + _ENGINE_FIELDS
            getters[kind] = operator.attrgetter(*fields)
            rows[kind] = namedtuple(f"Record{kind}", [f.lstrip("_") for f in fields])._make  # by the ABI's names
        self._getters, self._rows = getters, rows
        self.raw: dict[int, list[tuple]] = defaultdict(list)
        self._buffers: dict[int, Any] = {}
        self.buffers_given = 0
        self.buffers_refused = 0
        self.callback_errors: list[str] = []
        self.pairs = ClockPairs()
        self.enabled: list[int] = []
        self.closed = False
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.lib.gpu_local_available()
        if self.loaded_after_sycl:
            self.ctx.report.warning(
                "PTI was loaded after the SYCL runtime: SYCL-level (runtime API) records are missing. Import "
                "polyprof_xpu (or call polyprof_xpu.load_early()) before torch, or use `polyprof run`"
            )
        self.lib.set_callbacks(self._requested, self._completed)
        for name, kind in self.views.items():
            try:
                self.lib.enable(kind)
                self.enabled.append(kind)
            except Exception as exc:
                if kind in OPTIONAL_VIEWS.values() or kind == abi.VIEW_COLLECTION_OVERHEAD:
                    self.ctx.report.warning(f"view {name} could not be enabled: {exc}")
                else:
                    raise
        if abi.VIEW_RUNTIME_API in self.enabled and not self.all_runtime_apis:
            self.lib.work_submitting_runtime_only()
        self._pair()

    def start(self) -> None:
        self._pair()

    def push_correlation(self, ident: int, kind: str) -> None:
        self.lib.push(abi.EXTERNAL_KIND_CUSTOM_0 if kind == "op" else abi.EXTERNAL_KIND_CUSTOM_1, ident)

    def pop_correlation(self, kind: str) -> None:
        self.lib.pop(abi.EXTERNAL_KIND_CUSTOM_0 if kind == "op" else abi.EXTERNAL_KIND_CUSTOM_1)

    def stop(self) -> None:
        if not self.enabled:
            return
        for kind in self.enabled:
            self.lib.disable(kind)
        self.enabled = []
        self.lib.flush()
        self._pair()

    def close(self) -> None:
        self.stop()
        self.closed = True
        with self._lock:
            self.raw = defaultdict(list)

    def _pair(self) -> None:
        # 0: not implemented; PTI's default clock is then real time
        self.pairs.sample(lambda: self.lib.timestamp() or time.time_ns())

    # -- PTI's thread -----------------------------------------------------------------------------
    def _requested(self, buffer_ptr: Any, size_ptr: Any) -> None:
        try:
            if self.closed or self.buffers_given >= self.max_buffers:
                self.buffers_refused += 1
                buffer_ptr[0] = ctypes.POINTER(ctypes.c_uint8)()
                size_ptr[0] = 0
                return
            buf = (ctypes.c_uint8 * self.buffer_bytes)()
            self._buffers[ctypes.addressof(buf)] = buf
            self.buffers_given += 1
            buffer_ptr[0] = ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8))
            size_ptr[0] = self.buffer_bytes
        except BaseException as exc:  # never into C
            self._note(exc)

    def _completed(self, buffer: Any, size: int, used: int) -> None:
        try:
            address = ctypes.cast(buffer, ctypes.c_void_p).value
            try:
                if not self.closed and used:
                    getters, rows, parsed = self._getters, self._rows, defaultdict(list)
                    for kind, rec in self.lib.records(buffer, used):
                        values = getters[kind](rec)
                        parsed[kind].append(rows[kind](bytes(v) if isinstance(v, ctypes.Array) else v for v in values))
                    with self._lock:
                        for kind, rows in parsed.items():
                            self.raw[kind].extend(rows)
            finally:
                self._buffers.pop(address, None)  # the buffer is ours again: release it
        except BaseException as exc:
            self._note(exc)

    def _note(self, exc: BaseException) -> None:
        if len(self.callback_errors) < 10:
            self.callback_errors.append(f"{type(exc).__name__}: {exc}")

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        for message in self.callback_errors:
            self.ctx.report.error(f"PTI buffer callback failed: {message}")
        if self.buffers_refused:
            self.ctx.report.dropped_records(
                self.buffers_refused, f"buffers refused (cap of {self.max_buffers})"
            )
        mapping = self.pairs.fit()
        self.ctx.report.clock_mapping(mapping, "pti")
        sink.add_metadata("xpupti_version", self.lib.version_string)
        with self._lock:
            raw, self.raw = self.raw, defaultdict(list)
        span_to_host = mapping.span_to_host
        external = self._external_ids(raw.get(abi.VIEW_EXTERNAL_CORRELATION, []))
        pcis = sorted({_pci(r) for kind in _DEVICE_KINDS for r in raw.get(kind, [])})
        device_index = {pci: i for i, pci in enumerate(pcis)}
        host = sink.host_device()
        threads: dict[int, int] = {}

        def thread_row(tid: int) -> int:
            if tid not in threads:
                threads[tid] = sink.host_thread(tid)
            return threads[tid]

        def queue_row(r: Any) -> tuple[int, int, int, int]:
            pci = _pci(r)
            index = device_index[pci]
            raw_uuid = r.src_uuid if hasattr(r, "src_uuid") else r.device_uuid
            uuid = raw_uuid.hex() if isinstance(raw_uuid, bytes) and len(raw_uuid) == 16 else ""
            dev = sink.device(
                f"xpu:{pci}",
                type="xpu",
                index=index,
                name=f"Intel GPU {index} ({pci})",
                pid=index,
                label=f"XPU {index}",
                properties={"pciAddress": pci, "uuid": uuid},
            )
            sycl_queue, l0_queue = r.sycl_queue_id, r.queue_handle or 0
            queue = sycl_queue if sycl_queue not in abi.INVALID_QUEUE_IDS else l0_queue
            label = (
                f"queue {sycl_queue}"
                if sycl_queue not in abi.INVALID_QUEUE_IDS
                else f"l0 queue {l0_queue:#x}"
            )
            return dev, sink.resource(dev, queue, label), index, queue

        device_corr = set()
        for kind, activity_kind in (
            (abi.VIEW_DEVICE_GPU_KERNEL, ActivityKind.KERNEL),
            (abi.VIEW_DEVICE_GPU_MEM_COPY, ActivityKind.GPU_MEMCPY),
            (abi.VIEW_DEVICE_GPU_MEM_COPY_P2P, ActivityKind.GPU_MEMCPY),
            (abi.VIEW_DEVICE_GPU_MEM_FILL, ActivityKind.GPU_MEMSET),
        ):
            for r in raw.get(kind, []):
                dev, row, index, queue = queue_row(r)
                corr, start, end = r.correlation_id, r.start_timestamp, r.end_timestamp
                device_corr.add(corr)
                args = {
                    "correlation": corr,
                    "device": index,
                    "stream": queue,
                    "sycl queue": r.sycl_queue_id,
                    "l0 queue": f"{r.queue_handle or 0:#x}",
                    "context": f"{r.context_handle or 0:#x}",
                    "appended": (r.append_timestamp - start) / 1000.0 if r.append_timestamp else 0,
                    "submitted": (r.submit_timestamp - start) / 1000.0 if r.submit_timestamp else 0,
                }
                if kind == abi.VIEW_DEVICE_GPU_KERNEL:
                    name = _text(r.name)
                    args["kernel_id"] = r.kernel_id
                    if r.sycl_task_begin_timestamp:
                        args["sycl_task_begin"] = (r.sycl_task_begin_timestamp - start) / 1000.0
                elif kind == abi.VIEW_DEVICE_GPU_MEM_FILL:
                    name = f"Memset ({r.value_for_set} -> {abi.MEMORY_TYPES.get(r.mem_type, '?')})"
                    args.update({"l0 call": _text(r.name), "memory operation id": r.mem_op_id, "bytes": r.bytes})
                else:
                    copy = abi.MEMCPY_TYPES.get(r.memcpy_type, "?")
                    name = f"Memcpy {copy} ({abi.MEMORY_TYPES.get(r.mem_src, '?')} -> {abi.MEMORY_TYPES.get(r.mem_dst, '?')})"
                    args.update({"l0 call": _text(r.name), "memory operation id": r.mem_op_id, "bytes": r.bytes})
                    if kind == abi.VIEW_DEVICE_GPU_MEM_COPY_P2P:
                        name = name.replace("Memcpy", "Memcpy P2P", 1)
                        args.update({"src device pci": _pci(r), "dst device pci": _text(r.dst_pci_address)})
                if "bytes" in args and end > start:
                    args["memory bandwidth (GB/s)"] = round(args["bytes"] / (end - start), 6)
                if self.lib.v2:
                    args["engine ordinal"], args["engine index"] = r.engine_ordinal, r.engine_index
                h_start, h_end = span_to_host(start, end)
                sink.activity(
                    activity_kind,
                    name,
                    device=dev,
                    resource=row,
                    start=h_start,
                    end=h_end,
                    correlation=corr,
                    external_id=external.get(corr, 0),
                    flow_id=corr,
                    args=args,
                )
        runtime_corr = {r.correlation_id for r in raw.get(abi.VIEW_RUNTIME_API, [])}
        for kind, activity_kind, cat in (
            (abi.VIEW_RUNTIME_API, ActivityKind.RUNTIME, "xpu_runtime"),
            (abi.VIEW_DRIVER_API, ActivityKind.DRIVER, "xpu_driver"),
        ):
            names: dict[tuple[int, int], str] = {}
            for start, end, group, api_id, tid, corr, rc in raw.get(kind, []):
                name = names.get((group, api_id))
                if name is None:
                    name = names[(group, api_id)] = self.lib.api_name(group, api_id)
                # the runtime call starts the flow; a driver call only when no runtime call shares its id
                starts = corr in device_corr and (kind == abi.VIEW_RUNTIME_API or corr not in runtime_corr)
                h_start, h_end = span_to_host(start, end)
                sink.activity(
                    activity_kind,
                    name,
                    device=host,
                    resource=thread_row(tid),
                    start=h_start,
                    end=h_end,
                    cat=cat,
                    correlation=corr,
                    external_id=external.get(corr, 0),
                    flow_id=corr if starts else 0,
                    flow_start=True,
                    args={"correlation": corr, "return code": rc},
                )
        for synch, start, end, tid, corr, group, api_id, queue in raw.get(
            abi.VIEW_DEVICE_SYNCHRONIZATION, []
        ):
            h_start, h_end = span_to_host(start, end)
            sink.activity(
                ActivityKind.SYNC,
                abi.SYNC_TYPES.get(synch, "Sync"),
                device=host,
                resource=thread_row(tid),
                start=h_start,
                end=h_end,
                cat="xpu_sync",
                correlation=corr,
                external_id=external.get(corr, 0),
                args={
                    "correlation": corr,
                    "api": self.lib.api_name(group, api_id),
                    "l0 queue": f"{queue or 0:#x}",
                },
            )
        for start, end, tid, send, recv, communicator, name in raw.get(abi.VIEW_COMMUNICATION, []):
            h_start, h_end = span_to_host(start, end)
            sink.activity(
                ActivityKind.COLLECTIVE_COMM,
                f"xccl::{_text(name)}",
                device=host,
                resource=thread_row(tid),
                start=h_start,
                end=h_end,
                args={"send size": send, "recv size": recv, "communicator id": communicator},
            )
        overheads = raw.get(abi.VIEW_COLLECTION_OVERHEAD, [])
        if overheads:
            dev = sink.device(
                "pti-overhead", type="overhead", index=0, name="PTI Overhead", sort_index=0x100000, pid=-1
            )
            row = sink.resource(dev, 0, "overhead")
            for start, end, tid, count, kind in overheads:
                h_start, h_end = span_to_host(start, end)
                sink.activity(
                    ActivityKind.OVERHEAD,
                    abi.OVERHEAD_KINDS.get(kind, "Overhead"),
                    device=dev,
                    resource=row,
                    start=h_start,
                    end=h_end,
                    args={"count": count, "thread": tid},
                )

    @staticmethod
    def _external_ids(rows: list[tuple]) -> dict[int, int]:
        ops, annotations = {}, {}
        for corr, ext, kind in rows:
            (ops if kind == abi.EXTERNAL_KIND_CUSTOM_0 else annotations)[corr] = ext
        return {**annotations, **ops}
