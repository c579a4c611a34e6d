"""One OpenCL profiling session: record enqueues while a window records, then time each command from
its event's profiling information and map the device clock onto the host's.

``start`` samples each device's clock and installs the wrappers; ``stop`` removes them and samples
again; ``collect`` fits a clock mapping per device, and for each command writes a runtime row on the
calling thread and, when its queue is profiling-enabled, a device row on its queue, linked by an ac2g
flow, with the host annotation open at the enqueue as External id.
"""

from __future__ import annotations

from typing import Any

from polyprof.plugin import ActivityKind, ClockPairs, ProfileConfig, SessionBase, SessionContext, Sink
from polyprof_opencl.clock import DeviceClock
from polyprof_opencl.commands import DEVICE_KIND, KERNEL
from polyprof_opencl.devices import DeviceInfo
from polyprof_opencl.intercept import adopt_event, patches, recorder

RUNTIME_CAT = "opencl_runtime"


class OpenCLSession(SessionBase):
    def __init__(self, cl: Any, devices: list[DeviceInfo], config: ProfileConfig, ctx: SessionContext) -> None:
        super().__init__(config, ctx)
        self.cl = cl
        wanted = ctx.options.get("devices")
        self.devices = [d for d in devices if wanted is None or d.index in wanted]
        self.clocks = {d.index: (DeviceClock(cl, d.device), ClockPairs()) for d in self.devices}
        self.columns: Any = None  # the calls recorded (intercept.CallColumns.begin)

    def _sample_clocks(self) -> None:
        for index, (clock, pairs) in self.clocks.items():
            try:
                pairs.add(clock.sample())
            except Exception as exc:  # a device that cannot be sampled still has its commands, unaligned
                self.ctx.report.warning(f"device {index}: clock sampling failed ({exc}); its times are not aligned")

    def start(self) -> None:
        self._sample_clocks()
        self.columns = recorder.begin()
        patches.install(self.cl)

    def stop(self) -> None:
        if recorder.holder[0] is not None and recorder.holder[0] is self.columns:
            recorder.end()
            patches.remove()
            self._sample_clocks()

    def close(self) -> None:
        self.stop()
        for row in recorder.rows(self.columns) if self.columns is not None else ():  # never collected: release
            adopt_event(row[2])  # the retained handles
        self.columns = None  # no events, queues or kernels kept alive after the profile

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        rows, self.columns = (recorder.rows(self.columns) if self.columns is not None else []), None
        devices = {int(d.device.int_ptr): d for d in self.devices}
        mappings = self._mappings()
        for d in self.devices:
            sink.device(d.key, type="opencl", index=d.index, name=d.name, properties=d.properties, label="OpenCL")
        queues: dict[Any, Any] = {}  # queue pointer -> its row (see _queue); ("next", device) -> last number
        untimed: dict[int, int] = {}
        names: dict[int, str] = {}
        for spec, queue, event, start, end, tid, ext, error, a, b, c in rows:
            event, corr = adopt_event(event), self.ctx.new_correlation_id()
            name = self._kernel_name(a, names) if spec.category == KERNEL else spec.device_name()
            row = self._queue(sink, queue, devices, queues) if event is not None and not error else None
            sink.activity(ActivityKind.RUNTIME, spec.api, device=sink.host_device(), resource=sink.host_thread(tid),
                          start=start, end=end, cat=RUNTIME_CAT, correlation=corr, external_id=ext,
                          flow_id=corr if row and row[0] is not None else 0, flow_start=True,
                          args={"command": name, **({"error": error} if error else {})})
            if row is None:
                continue
            if row[0] is None:
                untimed[row[1]] = untimed.get(row[1], 0) + 1
                continue
            handle, resource, info, number = row
            try:
                event.wait()
                p = event.profile
                queued, submit, t0, t1 = int(p.queued), int(p.submit), int(p.start), int(p.end)
            except Exception:
                self.ctx.report.dropped_records(1, "commands whose event had no profiling information")
                continue
            host_start, host_end = mappings[info.index].span_to_host(t0, t1)
            args = {"device": info.index, "stream": number, "queue": number, "correlation": corr,
                    "queued": (t0 - queued) / 1000.0, "submitted": (t0 - submit) / 1000.0,  # us, as Kineto's
                    **_command_args(spec, a, b, c, t1 - t0)}
            sink.activity(DEVICE_KIND[spec.category], name, device=handle, resource=resource, start=host_start,
                          end=host_end, correlation=corr, external_id=ext, flow_id=corr, args=args)
        for number, count in untimed.items():
            self.ctx.report.warning(
                f"queue {number} was created without PROFILING_ENABLE (before the profile started) or is on a "
                f"device not profiled: its {count} command(s) appear as enqueue calls only, without device "
                "timing. Create queues after the profile starts, call polyprof_opencl.enable_queue_profiling() "
                "before creating them, or pass properties=cl.command_queue_properties.PROFILING_ENABLE."
            )
            self.ctx.report.dropped_records(count, "device records (queue without PROFILING_ENABLE)")

    def _mappings(self) -> dict[int, Any]:
        mappings = {}
        for index, (clock, pairs) in self.clocks.items():
            mappings[index] = mapping = pairs.fit()
            self.ctx.report.clock_mapping(mapping, f"opencl:{index}")
            report = self.ctx.report.clock[f"opencl:{index}"]
            report["method"] = pairs.pairs[0].method if len(pairs) else "none"
            if clock.error:
                report["note"] = clock.error
        return mappings

    def _queue(self, sink: Sink, queue: Any, devices: dict, queues: dict) -> tuple:
        """The row of a queue: (device handle, resource, info, number) when it is profiling-enabled and on
        a profiled device, else (None, number). Queues are numbered per device from 1 in order of first
        use: a trace thread id 0 is the process's own row to Perfetto, and HTA gives stream 0 no iteration."""
        key = _ptr(queue)
        if key not in queues:
            try:
                info = devices.get(int(queue.device.int_ptr))
                profiling = bool(queue.properties & self.cl.command_queue_properties.PROFILING_ENABLE)
            except Exception:
                info, profiling = None, False
            counter = ("next", info.index if info else -1)
            number = queues[counter] = queues.get(counter, 0) + 1
            handle = sink.device(info.key, type="opencl", index=info.index, name=info.name) if info and profiling else None
            queues[key] = (handle, sink.resource(handle, number, f"queue {number}"), info, number) if handle is not None else (None, number)
        return queues[key]

    @staticmethod
    def _kernel_name(kernel: Any, names: dict[int, str]) -> str:
        if id(kernel) not in names:
            try:
                names[id(kernel)] = str(kernel.function_name)
            except Exception:
                names[id(kernel)] = "kernel"
        return names[id(kernel)]


def _command_args(spec: Any, a: Any, b: Any, c: Any, duration_ns: int) -> dict[str, Any]:
    """A kernel's work sizes (and Kineto's grid/block), or a transfer's direction, bytes, bandwidth."""
    if spec.category == KERNEL:
        out: dict[str, Any] = {"global size": _dims(b)}
        local = _dims(c)
        if local:
            out["local size"], out["block"] = local, (local + [1, 1, 1])[:3]
            out["grid"] = ([-(-g // lo) for g, lo in zip(out["global size"], local, strict=False)] + [1, 1, 1])[:3]
        return out
    out = {"direction": spec.direction} if spec.direction else {}
    if a is not None:
        out["bytes"] = a
        if duration_ns > 0:
            out["memory bandwidth (GB/s)"] = round(a / duration_ns, 6)
    return out


def _dims(size: Any) -> list[int]:
    try:
        return [int(s) for s in ([size] if isinstance(size, int) else size or ())]
    except TypeError:
        return []


def _ptr(queue: Any) -> int:
    try:
        return int(queue.int_ptr)
    except Exception:
        return id(queue)
