"""One profile's AMD GPU tracing over rocprofiler-sdk's buffer tracing services.

The SDK delivers filled buffers on its own thread (and on the thread that flushes): ``_record`` copies
each record's fields into a tuple and returns; everything else happens at collect. Records are mapped
as Kineto maps CUDA's: kernels and copies on one process per GPU (``rocm:N``, HIP's device order) with
a row per queue, HIP runtime calls on the calling thread (category ``cuda_runtime``, as Kineto writes
HIP calls on ROCm builds), each runtime call joined to its device work by an ``ac2g`` flow keyed by the
SDK's internal correlation id, and the id polyprof pushed for the host op or annotation (the
rocprofiler external correlation id) written as the External id.
"""

from __future__ import annotations

import ctypes
import threading
from collections import defaultdict
from typing import Any

from polyprof.plugin import ActivityKind, ClockPairs, ProfileConfig, SessionContext, Sink
from polyprof.plugin.records import demangle, demangler_problem
from polyprof_rocm import rocprofiler_abi as abi

KINDS = {
    "kernel": abi.BUFFER_TRACING_KERNEL_DISPATCH,
    "memcpy": abi.BUFFER_TRACING_MEMORY_COPY,
    "hip_runtime": abi.BUFFER_TRACING_HIP_RUNTIME_API,
    "hsa": abi.BUFFER_TRACING_HSA_CORE_API,
    "marker": abi.BUFFER_TRACING_MARKER_CORE_API,
}
DEFAULT_KINDS = ("kernel", "memcpy", "hip_runtime")
#: runtime calls kept with runtime_apis="gpu_operations" besides those that launched device work
SYNCHRONIZING = ("Synchronize", "EventQuery", "StreamWaitEvent")

_FIELDS = {
    abi.BUFFER_TRACING_KERNEL_DISPATCH: lambda r: (
        r.correlation_id.internal, r.correlation_id.external.value, r.thread_id, r.start_timestamp,
        r.end_timestamp, r.dispatch_info.agent_id.handle, r.dispatch_info.queue_id.handle,
        r.dispatch_info.kernel_id, r.dispatch_info.dispatch_id, r.dispatch_info.private_segment_size,
        r.dispatch_info.group_segment_size, r.dispatch_info.workgroup_size.x, r.dispatch_info.workgroup_size.y,
        r.dispatch_info.workgroup_size.z, r.dispatch_info.grid_size.x, r.dispatch_info.grid_size.y,
        r.dispatch_info.grid_size.z,
    ),
    abi.BUFFER_TRACING_MEMORY_COPY: lambda r: (
        r.operation, r.correlation_id.internal, r.correlation_id.external.value, r.thread_id,
        r.start_timestamp, r.end_timestamp, r.dst_agent_id.handle, r.src_agent_id.handle, r.bytes,
    ),
}
_API_FIELDS = lambda r: (  # noqa: E731
    r.operation, r.correlation_id.internal, r.correlation_id.external.value, r.thread_id, r.start_timestamp, r.end_timestamp,
)
_API_CATEGORY = {
    abi.BUFFER_TRACING_HIP_RUNTIME_API: "cuda_runtime",
    abi.BUFFER_TRACING_HSA_CORE_API: "hsa_api",
    abi.BUFFER_TRACING_MARKER_CORE_API: "roctx",
}


class RocprofilerSession:
    def __init__(self, get_tool: Any, config: ProfileConfig, ctx: SessionContext) -> None:
        self.get_tool = get_tool
        self.ctx = ctx
        opts = ctx.options
        self.kinds = tuple(KINDS[k] for k in opts.get("kinds", DEFAULT_KINDS))
        self.all_runtime_apis = opts.get("runtime_apis", "gpu_operations") == "all"
        self.tool: Any = None
        self.raw: dict[int, list[tuple]] = defaultdict(list)
        self.unknown_layouts: dict[int, int] = defaultdict(int)
        self.pairs = ClockPairs()
        self.agents: list[dict[str, Any]] = []
        self.running = False
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.tool = self.get_tool(self.kinds)
        missing = [k for k in self.kinds if k not in self.tool.configured_kinds]
        if missing:
            names = [name for name, kind in KINDS.items() if kind in missing]
            self.ctx.report.warning(
                f"not traced: {', '.join(names)} (rocprofiler-sdk configures its services once per process; "
                "this process registered polyprof with other kinds, or the SDK refused them)"
            )
        self.agents = self.tool.lib.gpu_agents()
        self._pair()

    def start(self) -> None:
        self.tool.on_record = self._record
        self.tool.start()
        self.running = True
        self._pair()

    def push_correlation(self, ident: int, kind: str) -> None:
        self.tool.push(ident)

    def pop_correlation(self, kind: str) -> None:
        self.tool.pop()

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        self.tool.stop()  # stops the context, then flushes: the records arrive in _record
        self._pair()

    def close(self) -> None:
        if self.running:
            self.stop()
        if self.tool is not None and self.tool.on_record == self._record:
            self.tool.on_record = None
        with self._lock:
            self.raw = defaultdict(list)

    def _pair(self) -> None:
        self.pairs.sample(self.tool.lib.timestamp)

    # -- the SDK's thread -------------------------------------------------------------------------
    def _record(self, kind: int, payload: int) -> None:
        struct = abi.RECORDS.get(kind)
        if struct is None:
            return
        record = ctypes.cast(payload, ctypes.POINTER(struct)).contents
        if record.size < ctypes.sizeof(struct):
            self.unknown_layouts[kind] += 1  # an older layout than transcribed: not misread
            return
        row = _FIELDS.get(kind, _API_FIELDS)(record)
        with self._lock:
            self.raw[kind].append(row)

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        tool, report = self.tool, self.ctx.report
        for message in tool.callback_errors:
            report.error(f"rocprofiler-sdk callback: {message}")
        tool.callback_errors.clear()
        if tool.dropped_by_sdk:
            report.dropped_records(tool.dropped_by_sdk, "records (rocprofiler-sdk's buffer was full)")
            tool.dropped_by_sdk = 0
        kind_names = {kind: name for name, kind in KINDS.items()}
        for kind, count in self.unknown_layouts.items():
            report.dropped_records(
                count, f"{kind_names.get(kind, kind)} records (a layout older than polyprof-rocm reads)"
            )
        mapping = self.pairs.fit()
        report.clock_mapping(mapping, "rocprofiler")
        sink.add_metadata("rocprofiler_sdk_version", tool.lib.version_string)
        problem = demangler_problem()
        if problem:
            report.warning(f"kernel names stay mangled: {problem}")
        with self._lock:
            raw, self.raw = self.raw, defaultdict(list)
        span_to_host = mapping.span_to_host
        host = sink.host_device()
        gpus = self._gpus(sink)
        queues: dict[tuple[int, int], int] = {}
        threads: dict[int, int] = {}

        def thread_row(tid: int) -> int:
            if tid not in threads:
                threads[tid] = sink.host_thread(tid)
            return threads[tid]

        def queue_row(agent: int, queue: int) -> tuple[int, int, int]:
            dev, index = gpus(agent)
            key = (dev, queue)
            if key not in queues:
                number = sum(1 for d, _ in queues if d == dev)
                queues[key] = sink.resource(dev, number, f"stream {number} (queue {queue:#x})")
            return dev, queues[key], index

        device_corr: set[int] = set()
        for (corr, ext, _tid, start, end, agent, queue, kernel_id, dispatch_id, private, group,
             wx, wy, wz, gx, gy, gz) in raw.get(abi.BUFFER_TRACING_KERNEL_DISPATCH, []):
            dev, row, index = queue_row(agent, queue)
            device_corr.add(corr)
            name = tool.kernel_names.get(kernel_id)
            _device_work(sink, ActivityKind.KERNEL, demangle(name) if name else f"kernel {kernel_id}", dev, row,
                         span_to_host(start, end), corr, ext, {
                    "device": index, "stream": queue, "correlation": corr, "kernel id": kernel_id,
                    "dispatch id": dispatch_id, "grid": [_ceil(gx, wx), _ceil(gy, wy), _ceil(gz, wz)],
                    "block": [wx, wy, wz], "grid size (work-items)": [gx, gy, gz], "shared memory": group,
                    "private segment size": private,
                })
        for op, corr, ext, _tid, start, end, dst, src, nbytes in raw.get(abi.BUFFER_TRACING_MEMORY_COPY, []):
            direction = abi.MEMORY_COPY_NAMES.get(op, "?")
            agent = src if direction == "DtoH" else dst
            dev, row, index = queue_row(agent, 0)
            device_corr.add(corr)
            args = {"device": index, "correlation": corr, "bytes": nbytes, "kind": direction}
            if end > start:
                args["memory bandwidth (GB/s)"] = round(nbytes / (end - start), 6)
            _device_work(sink, ActivityKind.GPU_MEMCPY, f"Memcpy {direction}", dev, row, span_to_host(start, end),
                         corr, ext, args)
        for kind, category in _API_CATEGORY.items():
            names: dict[int, str] = {}
            for op, corr, ext, tid, start, end in raw.get(kind, []):
                name = names.get(op)
                if name is None:
                    name = names[op] = tool.lib.operation_name(kind, op)
                launched = corr in device_corr
                if kind == abi.BUFFER_TRACING_HIP_RUNTIME_API and not (
                    self.all_runtime_apis or launched or any(s in name for s in SYNCHRONIZING)
                ):
                    continue
                h_start, h_end = span_to_host(start, end)
                sink.activity(
                    ActivityKind.RUNTIME,
                    name,
                    device=host,
                    resource=thread_row(tid),
                    start=h_start,
                    end=h_end,
                    cat=category,
                    correlation=corr,
                    external_id=ext,
                    flow_id=corr if launched else 0,
                    flow_start=True,
                    args={"correlation": corr},
                )

    def _gpus(self, sink: Sink) -> Any:
        """agent handle -> (device, HIP index), declaring each GPU's process once, with Kineto's device
        properties; an agent rocprofiler did not list (it should not happen) gets the next index."""
        known = {a["id"]: a for a in self.agents}
        devices: dict[int, tuple[int, int]] = {}

        def device_of(agent: int) -> tuple[int, int]:
            if agent in devices:
                return devices[agent]
            info = known.get(agent, {})
            index = info.get("logical_node_type_id", len(devices))
            product = info.get("product") or info.get("name") or f"agent {agent:#x}"
            dev = sink.device(
                f"rocm:{index}",
                type="gpu",
                index=index,
                name=f"AMD GPU {index} ({product})",
                pid=index,
                label=f"GPU {index}",
                properties={
                    "name": product, "totalGlobalMem": info.get("local_mem_size", 0),
                    "numSms": info.get("cu_count", 0), "warpSize": info.get("wave_front_size", 0),
                    "gcnArchName": info.get("name", ""),
                },
            )
            devices[agent] = (dev, index)
            return devices[agent]

        return device_of


def _device_work(sink: Sink, kind: ActivityKind, name: str, dev: int, row: int, span: tuple[int, int], corr: int,
                 ext: int, args: dict) -> None:
    """One kernel or copy on its GPU row (`span` on the host clock), the end of its launch's ac2g flow
    (keyed by the correlation)."""
    sink.activity(kind, name, device=dev, resource=row, start=span[0], end=span[1], correlation=corr,
                  external_id=ext, flow_id=corr, args=args)


def _ceil(total: int, size: int) -> int:
    return -(-int(total) // int(size)) if size else int(total)

