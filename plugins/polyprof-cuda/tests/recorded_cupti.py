"""A CUPTI that replays what a GPU would have produced, for tests without a GPU.

:class:`FakeCupti` stands in for the ``cupti.cupti`` module and nothing else: the real
:class:`polyprof_cuda.cupti_layer.CuptiLayer` runs on top of it. Its enums, record classes, params
structs and errors are cupti-python's own; each function it implements accepts exactly the arguments
of the real function of that name (checked against the installed release's signature on every call)
and does what libcupti documents: pointers are written through, buffers are requested and delivered
on another thread, an occupied subscriber slot is refused with the holder's name written into the
caller's ``oldSubscriberName`` buffer. Records are real record objects built only with fields that
``cupti.pyi`` declares, of the newest layout the installed release has.

What this does not exercise: the real libcupti, the driver, buffer management inside cupti-python,
and real timing. Those run in scripts/device-check.py on a GPU.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import inspect
import os
import re
import threading

from polyprof_cuda.cupti_layer import CuptiLayer, DeviceFacts

from polyprof.plugin.clock import host_ns

RUNTIME_NAMES = {
    211: "cudaLaunchKernel",
    41: "cudaMemcpyAsync",
    53: "cudaMemsetAsync",
    131: "cudaStreamSynchronize",
    311: "cudaGraphLaunch",
    10: "cudaGetDevice",
}
DRIVER_NAMES = {307: "cuLaunchKernel"}


@functools.lru_cache(maxsize=1)
def stub_fields() -> dict[str, set[str]]:
    """Field names of every class in cupti-python's type stubs (cupti/cupti.pyi)."""
    import cupti

    path = os.path.join(os.path.dirname(cupti.__file__), "cupti.pyi")
    tree = ast.parse(open(path).read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
    return out


def dtype_name(class_name: str) -> str:
    """cupti-python's name for a layout's numpy dtype: ActivityMemcpyPtoP4 -> activity_memcpy_pto_p4_dtype."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", class_name).lower() + "_dtype"


def layout_dtype(module, cls: type):
    """The numpy dtype cupti-python publishes for record class `cls`, or None."""
    import numpy as np

    dtype = getattr(module, dtype_name(cls.__name__), None)
    return dtype if isinstance(dtype, np.dtype) and dtype.names else None


def make_record(class_name: str, **fields):
    """A record of `class_name` with `fields` set and every other byte 0 (some cupti-python releases
    leave a new record's memory uninitialised)."""
    from cupti import cupti

    declared = stub_fields()[class_name]
    unknown = set(fields) - declared
    assert not unknown, f"{class_name} has no field(s) {sorted(unknown)} in cupti.pyi"
    cls = getattr(cupti, class_name)
    record = cls()
    dtype = layout_dtype(cupti, cls)
    if dtype is not None:
        ctypes.memset(record.ptr, 0, dtype.itemsize)
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def latest_class(prefix: str) -> str:
    """The newest record layout of a family the installed cupti-python has (e.g. ActivityKernel10)."""
    numbered = [
        (int(m.group(1) or 0), name)
        for name in stub_fields()
        if (m := re.fullmatch(re.escape(prefix) + r"(\d*)", name))
    ]
    return max(numbered)[1]


def kernel_record(name: str, start: int, end: int, correlation_id: int, **fields):
    """A concurrent-kernel record of the newest layout: a 64x1x1 grid of 128x1x1 blocks on device 0,
    context 1, stream 7, unless `fields` say otherwise."""
    from cupti import cupti

    defaults = dict(
        device_id=0,
        context_id=1,
        stream_id=7,
        registers_per_thread=32,
        static_shared_memory=1024,
        dynamic_shared_memory=0,
        grid_x=64,
        grid_y=1,
        grid_z=1,
        block_x=128,
        block_y=1,
        block_z=1,
    )
    return make_record(
        latest_class("ActivityKernel"),
        kind=int(cupti.ActivityKind.CONCURRENT_KERNEL),
        name=name,
        start=start,
        end=end,
        correlation_id=correlation_id,
        **{**defaults, **fields},
    )


def mirrors_real(method):
    """Bind each call to the real ``cupti.cupti`` function's signature: a wrong call fails here."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        inspect.signature(getattr(self.real, method.__name__)).bind(*args, **kwargs)
        return method(self, *args, **kwargs)

    return checked


class FakeCupti:
    """``cupti.cupti`` for a machine with `devices` GPUs whose clock runs `offset_ns` ahead of the host
    clock and `drift_ppm` fast. Tests drive "the GPU" with launch_kernel(), memcpy() and the like."""

    def __init__(
        self,
        offset_ns: int = 7_000_000_000,
        drift_ppm: float = 20.0,
        subscriber: str | None = None,
        dropped: int = 0,
        deliver_late: bool = False,
        subscribe_error: str | None = None,
    ) -> None:
        from cupti import cupti

        self.real = cupti
        self.offset_ns, self.drift = offset_ns, drift_ppm * 1e-6
        self.subscriber, self.dropped, self.deliver_late = subscriber, dropped, deliver_late
        self.subscribe_error = subscribe_error  # a cupti.Result name: CUPTI refuses subscribers with it
        self.enabled: set[int] = set()
        self.pending: list = []
        self.stacks: dict[int, list[int]] = {}
        self.callbacks = None
        self.subscribers: set[int] = set()  # handles not yet unsubscribed
        self.subscriber_names: list[str] = []  # of every successful subscribe
        self.attributes: dict[int, int] = {}
        self.enabled_when_attributes_set: list[int] | None = None
        self.refuse_attributes = 0
        self.thread_id_type = None
        self.latency_timestamps = 0
        self.next_corr = 1000
        self.t0 = host_ns()
        self.raw = FakeLibCupti(self)
        self.class_of_kind: dict[int, type] = {}

    def __dir__(self):
        return sorted(set(dir(self.real)) | set(super().__dir__()))

    def __getattr__(self, name):
        """Enums, record classes, params structs, errors and constants: the real module's."""
        value = getattr(self.real, name)
        if callable(value) and not isinstance(value, type):
            raise AttributeError(f"FakeCupti does not implement cupti.{name}()")
        return value

    # -- cupti.cupti's functions --------------------------------------------------------------------
    @mirrors_real
    def get_timestamp(self) -> int:
        h = host_ns()
        return int(self.offset_ns + self.t0 + (h - self.t0) * (1 + self.drift))

    @mirrors_real
    def activity_enable(self, kind) -> None:
        self.enabled.add(int(kind))

    @mirrors_real
    def activity_disable(self, kind) -> None:
        self.enabled.discard(int(kind))

    @mirrors_real
    def set_thread_id_type(self, type) -> None:  # noqa: A002 (the real parameter's name)
        self.thread_id_type = int(type)

    @mirrors_real
    def activity_enable_latency_timestamps(self, enable) -> None:
        self.latency_timestamps = int(enable)

    @mirrors_real
    def activity_set_attribute(self, attr, value_size, value) -> None:
        """Like cuptiActivitySetAttribute: both arguments are addresses."""
        if self.refuse_attributes:
            raise self.real.cuptiError(self.refuse_attributes)
        size = ctypes.c_size_t.from_address(value_size).value
        assert size == ctypes.sizeof(ctypes.c_size_t), f"attribute {attr}: value size {size}"
        self.attributes[int(attr)] = ctypes.c_size_t.from_address(value).value
        self.enabled_when_attributes_set = sorted(self.enabled)

    @mirrors_real
    def activity_register_callbacks(self, func_buffer_requested, func_buffer_completed) -> None:
        self.callbacks = (func_buffer_requested, func_buffer_completed)

    @mirrors_real
    def subscribe_v2(self, callback, userdata, p_params) -> int:
        params = self.real.SubscriberParams.from_ptr(p_params)
        if params.struct_size != self.real.SUBSCRIBER_PARAMS_SIZE:
            raise self.real.cuptiError(int(self.real.Result.ERROR_INVALID_PARAMETER))
        if self.subscribe_error:
            raise self.real.cuptiError(int(getattr(self.real.Result, self.subscribe_error)))
        if self.subscriber is not None:
            # CUPTI writes the holder's name into the caller's buffer (oldSubscriberName, with its size
            # in oldSubscriberSize: the 3rd and 4th fields of CUpti_SubscriberParams)
            address, size = (ctypes.c_size_t * 4).from_address(p_params)[2:4]
            if address:
                ctypes.memmove(
                    address, self.subscriber.encode()[: size - 1] + b"\0", min(size, len(self.subscriber) + 1)
                )
            raise self.real.cuptiError(int(self.real.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))
        handle = len(self.subscriber_names) + 1
        self.subscriber_names.append(params.subscriber_name)
        self.subscribers.add(handle)
        return handle

    @mirrors_real
    def unsubscribe(self, subscriber) -> None:
        self.subscribers.remove(subscriber)

    @mirrors_real
    def activity_flush_all(self, flag) -> None:
        records, self.pending = self.pending, []
        if self.deliver_late:  # the first half arrives before the flush, from CUPTI's own thread
            half = len(records) // 2
            self.raw.deliver(records[:half])
            records = records[half:]
        self.raw.deliver(records)

    @mirrors_real
    def activity_get_num_dropped_records(self, context, stream_id, dropped) -> None:
        ctypes.c_uint64.from_address(dropped).value = self.dropped

    @mirrors_real
    def activity_push_external_correlation_id(self, kind, id) -> None:  # noqa: A002
        self.stacks.setdefault(int(kind), []).append(id)

    @mirrors_real
    def activity_pop_external_correlation_id(self, kind) -> int:
        return self.stacks[int(kind)].pop()

    @mirrors_real
    def get_callback_name(self, domain, cbid) -> str:
        names = RUNTIME_NAMES if domain == self.real.CallbackDomain.RUNTIME_API else DRIVER_NAMES
        return names.get(cbid, f"api{cbid}")

    # -- helpers ----------------------------------------------------------------------------------
    def kind_value(self, name: str) -> int:
        return int(getattr(self.real.ActivityKind, name))

    def tracing(self, kind_name: str) -> bool:
        return self.kind_value(kind_name) in self.enabled

    def external_stacks(self) -> dict[str, list[int]]:
        """The pushed external ids, as "op" (CUSTOM0) and "annotation" (CUSTOM1)."""
        kinds = self.real.ExternalCorrelationKind
        return {
            "op": list(self.stacks.get(int(kinds.CUSTOM0), [])),
            "annotation": list(self.stacks.get(int(kinds.CUSTOM1), [])),
        }

    # -- what "the GPU" does when the program launches work ------------------------------------
    def _api_and_externals(self, cbid: int, kind_name: str = "RUNTIME"):
        corr = self.next_corr = self.next_corr + 1
        t0 = self.get_timestamp()
        t1 = t0 + 3_000
        if self.tracing(kind_name):
            self.pending.append(
                make_record(
                    "ActivityAPI",
                    kind=self.kind_value(kind_name),
                    cbid=cbid,
                    start=t0,
                    end=t1,
                    thread_id=threading.get_native_id(),
                    correlation_id=corr,
                    process_id=os.getpid(),
                )
            )
        if self.tracing("EXTERNAL_CORRELATION"):
            for kind, stack in self.stacks.items():
                if stack:
                    self.pending.append(
                        make_record(
                            "ActivityExternalCorrelation",
                            kind=self.kind_value("EXTERNAL_CORRELATION"),
                            external_kind=kind,
                            external_id=stack[-1],
                            correlation_id=corr,
                        )
                    )
        return corr, t1

    def launch_kernel(self, name="gemm", device=0, stream=7, duration=20_000, driver=False, queued=None):
        """queued: the record's queued timestamp (default 1 us after the launch call returned; CUPTI
        writes CUPTI_TIMESTAMP_UNKNOWN, 2**64 - 1, when latency timestamps are off)."""
        corr, t = self._api_and_externals(307 if driver else 211, "DRIVER" if driver else "RUNTIME")
        if self.tracing("CONCURRENT_KERNEL"):
            self.pending.append(
                kernel_record(
                    name,
                    t + 5_000,
                    t + 5_000 + duration,
                    corr,
                    device_id=device,
                    stream_id=stream,
                    queued=t + 1_000 if queued is None else queued,
                )
            )
        return corr

    def memcpy(self, direction="HTOD", nbytes=1 << 20, device=0, stream=7):
        corr, t = self._api_and_externals(41)
        kinds = {"HTOD": ("PAGEABLE", "DEVICE"), "DTOH": ("DEVICE", "PINNED"), "DTOD": ("DEVICE", "DEVICE")}[
            direction
        ]
        if self.tracing("MEMCPY"):
            self.pending.append(
                make_record(
                    latest_class("ActivityMemcpy"),
                    kind=self.kind_value("MEMCPY"),
                    copy_kind=int(getattr(self.real.ActivityMemcpyKind, direction)),
                    src_kind=int(getattr(self.real.ActivityMemoryKind, kinds[0])),
                    dst_kind=int(getattr(self.real.ActivityMemoryKind, kinds[1])),
                    bytes=nbytes,
                    start=t + 4_000,
                    end=t + 104_000,
                    device_id=device,
                    context_id=1,
                    stream_id=stream,
                    correlation_id=corr,
                )
            )
        return corr

    def memset(self, nbytes=4096, device=0, stream=7):
        corr, t = self._api_and_externals(53)
        if self.tracing("MEMSET"):
            self.pending.append(
                make_record(
                    latest_class("ActivityMemset"),
                    kind=self.kind_value("MEMSET"),
                    bytes=nbytes,
                    value=0,
                    memory_kind=int(self.real.ActivityMemoryKind.DEVICE),
                    start=t + 2_000,
                    end=t + 3_000,
                    device_id=device,
                    context_id=1,
                    stream_id=stream,
                    correlation_id=corr,
                )
            )
        return corr

    def synchronize(self, stream=7, sync_type="STREAM_SYNCHRONIZE"):
        corr, t = self._api_and_externals(131)
        if self.tracing("SYNCHRONIZATION"):
            self.pending.append(
                make_record(
                    latest_class("ActivitySynchronization"),
                    kind=self.kind_value("SYNCHRONIZATION"),
                    type=int(getattr(self.real.ActivitySynchronizationType, sync_type)),
                    start=t - 2_000,
                    end=t,
                    context_id=1,
                    stream_id=stream,
                    correlation_id=corr,
                    cuda_event_id=0,
                )
            )
        return corr

    def graph_launch(self, nodes=3, device=0, stream=9):
        corr, t = self._api_and_externals(311)
        if self.tracing("CONCURRENT_KERNEL"):
            for i in range(nodes):
                self.pending.append(
                    kernel_record(
                        f"graph_node_{i}",
                        t + 10_000 * (i + 1),
                        t + 10_000 * (i + 1) + 5_000,
                        corr,
                        device_id=device,
                        stream_id=stream,
                        registers_per_thread=16,
                        static_shared_memory=0,
                        grid_x=1,
                        block_x=32,
                        graph_id=5,
                        graph_node_id=100 + i,
                    )
                )
        return corr

    def uninteresting_api(self):
        return self._api_and_externals(10)[0]


class FakeLibCupti:
    """libcupti's raw buffer API as :class:`~polyprof_cuda.libcupti.LibCupti` binds it: buffers are
    requested from the registered callback, filled with the records' real bytes (their C structs, 8-byte
    aligned, as CUPTI lays them out) and handed back from another thread; the walk follows CUPTI's."""

    def __init__(self, fake: FakeCupti, buffer_limit: int | None = None) -> None:
        self.fake = fake
        self.callbacks = None
        self.buffer_limit = buffer_limit  # fill at most this many bytes of each buffer
        self.delivered_buffers = 0
        self.registrations = 0
        self.kept_alive: list = []  # kernel names live in CUPTI's memory: here, in the record objects

    def register_buffer_callbacks(self, requested, completed) -> None:
        self.callbacks = (requested, completed)
        self.registrations += 1

    def unregister(self) -> None:
        self.callbacks = None

    def _size(self, record_addr: int) -> int:
        from cupti import cupti

        kind = ctypes.c_uint32.from_address(record_addr).value
        cls = self.fake.class_of_kind[kind]
        return (layout_dtype(cupti, cls).itemsize + 7) & ~7

    def next_record(self, buffer: int, valid: int, record: int) -> int | None:
        following = record + self._size(record)
        return following if following < buffer + valid else None

    def deliver(self, records: list) -> None:
        from cupti import cupti

        assert self.callbacks is not None, "CUPTI delivers only to registered buffer callbacks"
        requested, completed = self.callbacks
        self.kept_alive.extend(records)
        finished = []
        addr, size = requested()
        limit = min(size, self.buffer_limit or size)
        used = 0
        for r in records:
            self.fake.class_of_kind[int(r.kind)] = type(r)
            nbytes = layout_dtype(cupti, type(r)).itemsize
            if used + nbytes > limit:  # full: hand it back, ask for another
                finished.append((addr, used))
                addr, size = requested()
                used = 0
            ctypes.memmove(addr + used, r.ptr, nbytes)
            used += (nbytes + 7) & ~7
        finished.append((addr, used))
        self.delivered_buffers += len(finished)
        for addr, valid in finished:  # CUPTI delivers on its own thread
            t = threading.Thread(target=completed, args=(addr, valid))
            t.start()
            t.join()


class RecordedLayer(CuptiLayer):
    """The real CuptiLayer over :class:`FakeCupti`; only the device facts, which come from
    cuda-bindings and the driver, are given. `layer.launch_kernel()` and the like drive the fake GPU."""

    def __init__(self, devices: int = 2, **fake_options) -> None:
        fake = FakeCupti(**fake_options)
        super().__init__(module=fake, libcupti=fake.raw)
        self.n_devices = devices

    def __getattr__(self, name):  # the fake GPU's methods and state: layer.launch_kernel(), ...
        try:
            fake = self.__dict__["c"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(fake, name)

    def devices(self):
        return [
            DeviceFacts(i, f"Fake GPU {i}", {"totalGlobalMem": 80 << 30, "computeMajor": 9, "numSms": 132})
            for i in range(self.n_devices)
        ]

    @staticmethod
    def driver_version() -> int:
        return 13000

    @property
    def preallocated(self) -> tuple | None:
        """(device buffers, semaphore pools, kinds enabled when they were set), or None if never set."""
        attrs = self.c.real.ActivityAttribute
        if self.c.enabled_when_attributes_set is None:
            return None
        return (
            self.c.attributes.get(int(attrs.ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE)),
            self.c.attributes.get(int(attrs.ATTR_PROFILING_SEMAPHORE_PRE_ALLOCATE_VALUE)),
            self.c.enabled_when_attributes_set,
        )
