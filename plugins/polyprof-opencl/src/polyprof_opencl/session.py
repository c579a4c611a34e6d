"""One OpenCL profiling session: record enqueues while active, then time them from event profiling."""

from __future__ import annotations

from typing import Any

from polyprof.plugin import ActivityKind, ClockMapping, ProfileConfig, SessionContext, Sink
from polyprof_opencl.clock import ClockPair, DeviceClock
from polyprof_opencl.devices import DeviceInfo
from polyprof_opencl.intercept import (
    KERNEL,
    MAP,
    MEMCPY,
    MEMSET,
    UNMAP,
    Record,
    adopt_event,
    patches,
    recorder,
)

DEVICE_KIND = {
    KERNEL: ActivityKind.KERNEL,
    MEMCPY: ActivityKind.GPU_MEMCPY,
    MEMSET: ActivityKind.GPU_MEMSET,
    MAP: ActivityKind.GPU_MEMCPY,
    UNMAP: ActivityKind.GPU_MEMCPY,
}
COPY_NAMES = {
    "HtoD": "Memcpy HtoD (Host -> Device)",
    "DtoH": "Memcpy DtoH (Device -> Host)",
    "DtoD": "Memcpy DtoD (Device -> Device)",
    "SVM": "Memcpy SVM",
}
RUNTIME_CAT = "opencl_runtime"


class OpenCLSession:
    def __init__(
        self, cl: Any, devices: list[DeviceInfo], config: ProfileConfig, ctx: SessionContext
    ) -> None:
        self.cl = cl
        self.ctx = ctx
        wanted = ctx.options.get("devices")
        self.devices = [d for d in devices if wanted is None or d.index in wanted]
        self.columns: tuple[list, ...] | None = None
        self.clocks: dict[int, DeviceClock] = {}
        self.pairs: dict[int, list[ClockPair]] = {}
        self.recording = False
        self._kernel_names: dict[int, str] = {}

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        for d in self.devices:
            self.clocks[d.index] = DeviceClock(self.cl, d.device)
            self.pairs[d.index] = []

    def _sample_clocks(self) -> None:
        for index, clock in self.clocks.items():
            try:
                self.pairs[index].append(clock.sample())
            except Exception as exc:
                self.ctx.report.warning(
                    f"device {index}: clock sampling failed ({exc}); its times are not aligned"
                )

    def start(self) -> None:
        self._sample_clocks()
        self.columns = recorder.begin()
        patches.install(self.cl)
        self.recording = True

    def stop(self) -> None:
        if not self.recording:
            return
        self.recording = False
        recorder.end()
        patches.remove()
        self._sample_clocks()

    def close(self) -> None:
        self.stop()
        if self.columns:  # never collected: release the raw event handles we retained
            for event in self.columns[2]:
                adopt_event(event)
        self.columns = None  # no events, queues or kernels kept alive after the profile
        for clock in self.clocks.values():
            clock.close()
        self.clocks = {}

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        records = [Record.decode(raw) for raw in recorder.rows(self.columns)] if self.columns else []
        for rec in records:
            rec.event = adopt_event(rec.event)
        self.columns = None
        by_device_ptr = {int(d.device.int_ptr): d for d in self.devices}
        mappings = self._mappings()
        host = sink.host_device()
        queue_rows: dict[int, tuple[int, int, DeviceInfo] | None] = {}  # queue ptr -> (device, row, info)
        queue_numbers: dict[int, int] = {}
        untimed: dict[int, int] = {}
        self._next_queue_number: dict[int, int] = {}
        for d in self.devices:
            sink.device(
                d.key, type="opencl", index=d.index, name=d.name, properties=d.properties, label="OpenCL"
            )
        for rec in records:
            corr = self.ctx.new_correlation_id()
            thread = sink.host_thread(rec.tid)
            name = self._device_name(rec)
            runtime_args: dict[str, Any] = {"command": name}
            if rec.error:
                runtime_args["error"] = rec.error
            timed = rec.event is not None and not rec.error
            row = (
                self._queue_row(sink, rec.queue, by_device_ptr, queue_rows, queue_numbers) if timed else None
            )
            sink.activity(
                ActivityKind.RUNTIME,
                rec.spec.api,
                device=host,
                resource=thread,
                start=rec.start,
                end=rec.end,
                cat=RUNTIME_CAT,
                correlation=corr,
                external_id=rec.external_id,
                flow_id=corr if row is not None else 0,
                flow_start=True,
                args=runtime_args,
            )
            if not timed:
                continue
            if row is None:
                qptr = _ptr(rec.queue)
                untimed[qptr] = untimed.get(qptr, 0) + 1
                continue
            device_handle, resource, info = row
            times = self._device_times(rec)
            if times is None:
                self.ctx.report.dropped_records(1, "commands whose event had no profiling information")
                continue
            queued, submit, start, end = times
            mapping = mappings[info.index]
            start_h, end_h = mapping.to_host(start), mapping.to_host(end)
            args = {
                "device": info.index,
                "stream": queue_numbers[_ptr(rec.queue)],
                "queue": queue_numbers[_ptr(rec.queue)],
                "correlation": corr,
                "queued": (start - queued) / 1000.0,  # us between enqueue and start, as Kineto's "queued"
                "submitted": (start - submit) / 1000.0,
            }
            args.update(self._command_args(rec, end - start))
            sink.activity(
                DEVICE_KIND[rec.spec.category],
                name,
                device=device_handle,
                resource=resource,
                start=start_h,
                end=max(end_h, start_h),
                correlation=corr,
                external_id=rec.external_id,
                flow_id=corr,
                args=args,
            )
        self._report_untimed(untimed, queue_numbers)

    def _mappings(self) -> dict[int, ClockMapping]:
        mappings = {}
        for index, pairs in self.pairs.items():
            if pairs:
                mapping = ClockMapping.fit(
                    [p.device_ns for p in pairs],
                    [p.host_ns for p in pairs],
                    uncertainty_ns=max(p.uncertainty_ns for p in pairs),
                )
            else:
                mapping = ClockMapping.identity()
            mappings[index] = mapping
            clock = self.clocks.get(index)
            self.ctx.report.clock_mapping(mapping, f"opencl:{index}")
            report = self.ctx.report.clock[f"opencl:{index}"]
            report["method"] = pairs[0].method if pairs else "none"
            if clock is not None and clock.error:
                report["note"] = clock.error
        return mappings

    def _queue_row(self, sink: Sink, queue: Any, by_device_ptr: dict, rows: dict, numbers: dict) -> Any:
        """(device handle, resource, device info) of a profiling-enabled queue on a profiled device,
        else None. Queues are numbered per device in order of first use from 1 ("queue 1", "queue 2"...):
        a trace thread id 0 is the process's own row to Perfetto, and HTA gives stream 0 no iteration."""
        qptr = _ptr(queue)
        if qptr in rows:
            return rows[qptr]
        try:
            info = by_device_ptr.get(int(queue.device.int_ptr))
            profiling = bool(queue.properties & self.cl.command_queue_properties.PROFILING_ENABLE)
        except Exception:
            info, profiling = None, False
        number = self._next_queue_number.get(info.index if info else -1, 1)
        self._next_queue_number[info.index if info else -1] = number + 1
        numbers[qptr] = number
        row = None
        if info is not None and profiling:
            device_handle = sink.device(info.key, type="opencl", index=info.index, name=info.name)
            row = (device_handle, sink.resource(device_handle, number, f"queue {number}"), info)
        rows[qptr] = row
        return row

    def _report_untimed(self, untimed: dict[int, int], numbers: dict[int, int]) -> None:
        for qptr, count in untimed.items():
            self.ctx.report.warning(
                f"queue {numbers.get(qptr, '?')} was created without PROFILING_ENABLE (before the profile "
                f"started) or is on a device not profiled: its {count} command(s) appear as enqueue calls "
                "only, without device timing. Create queues after the profile starts, call "
                "polyprof_opencl.enable_queue_profiling() before creating them, or pass "
                "properties=cl.command_queue_properties.PROFILING_ENABLE."
            )
            self.ctx.report.dropped_records(count, "device records (queue without PROFILING_ENABLE)")

    def _device_times(self, rec: Record) -> tuple[int, int, int, int] | None:
        try:
            rec.event.wait()
            p = rec.event.profile
            return int(p.queued), int(p.submit), int(p.start), int(p.end)
        except Exception:
            return None

    def _device_name(self, rec: Record) -> str:
        category = rec.spec.category
        if category == KERNEL:
            kernel = rec.kernel
            key = id(kernel)
            name = self._kernel_names.get(key)
            if name is None:
                try:
                    name = str(kernel.function_name)
                except Exception:
                    name = "kernel"
                self._kernel_names[key] = name
            return name
        if category == MEMCPY:
            return COPY_NAMES.get(rec.spec.direction, "Memcpy")
        if category == MEMSET:
            return "Memset (Fill)"
        # named "Memcpy ..." so that HTA, which types device rows by name, counts them as memory
        return "Memcpy Map" if category == MAP else "Memcpy Unmap"

    @staticmethod
    def _command_args(rec: Record, duration_ns: int) -> dict[str, Any]:
        if rec.spec.category == KERNEL:
            out: dict[str, Any] = {"global size": _dims(rec.global_size)}
            local = _dims(rec.local_size)
            if local:
                out["local size"] = local
                out["block"] = (local + [1, 1, 1])[:3]
                out["grid"] = (
                    [-(-size // group) for size, group in zip(out["global size"], local, strict=False)]
                    + [1, 1, 1]
                )[:3]
            return out
        out = {"direction": rec.spec.direction} if rec.spec.direction else {}
        if rec.nbytes is not None:
            out["bytes"] = rec.nbytes
            if duration_ns > 0:
                out["memory bandwidth (GB/s)"] = round(rec.nbytes / duration_ns, 6)
        return out


def _dims(size: Any) -> list[int]:
    if size is None:
        return []
    if isinstance(size, int):
        return [size]
    try:
        return [int(s) for s in size]
    except TypeError:
        return []


def _ptr(queue: Any) -> int:
    try:
        return int(queue.int_ptr)
    except Exception:
        return id(queue)
