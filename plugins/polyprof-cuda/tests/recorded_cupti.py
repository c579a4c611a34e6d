"""A CUPTI layer that replays what a GPU would have produced, for tests without a GPU.

Records are real ``cupti.cupti`` record objects (cupti-python is installed in CI; it imports without a
driver), built only with fields that ``cupti.pyi`` declares for their class, so a typo or a field that
a cupti-python release renamed fails here. What this does not exercise: the real libcupti, the driver,
buffer management inside cupti-python, and real timing. Those run in scripts/device-check.py on a GPU.
"""

from __future__ import annotations

import ast
import functools
import os
import threading

from polyprof_cuda.cupti_layer import CuptiUnavailable, DeviceFacts

from polyprof.clock import host_ns

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


def make_record(class_name: str, **fields):
    from cupti import cupti

    declared = stub_fields()[class_name]
    unknown = set(fields) - declared
    assert not unknown, f"{class_name} has no field(s) {sorted(unknown)} in cupti.pyi"
    record = getattr(cupti, class_name)()
    for key, value in fields.items():
        setattr(record, key, value)
    return record


class RecordedLayer:
    """Stands in for CuptiLayer: its clock runs `offset_ns` ahead of the host clock, `drift_ppm` fast."""

    def __init__(
        self,
        offset_ns: int = 7_000_000_000,
        drift_ppm: float = 20.0,
        devices: int = 2,
        subscriber: str | None = None,
        dropped: int = 0,
        deliver_late: bool = False,
    ) -> None:
        from cupti import cupti

        self.c = cupti
        self.offset_ns, self.drift = offset_ns, drift_ppm * 1e-6
        self.n_devices, self.subscriber, self.dropped = devices, subscriber, dropped
        self.deliver_late = deliver_late
        self.enabled: list[str] = []
        self.pending: list = []
        self.stacks = {"op": [], "annotation": []}
        self.callbacks = None
        self.next_corr = 1000
        self.t0 = host_ns()
        self.late_thread: threading.Thread | None = None
        self.preallocated: tuple | None = None
        self.refuse_preallocation = 0

    # -- CuptiLayer's interface -----------------------------------------------------------------
    @staticmethod
    def package_version() -> str:
        return "13.4.0"

    def check_ready(self) -> None:
        pass

    def devices(self):
        return [
            DeviceFacts(i, f"Fake GPU {i}", {"totalGlobalMem": 80 << 30, "computeMajor": 9, "numSms": 132})
            for i in range(self.n_devices)
        ]

    def kind_value(self, name: str) -> int:
        return int(getattr(self.c.ActivityKind, name))

    def enable(self, kinds):
        self.enabled = list(kinds)

    def disable(self, kinds):
        self.enabled = []

    def use_system_thread_ids(self):
        pass

    def preallocate(self, device_buffers, semaphore_pools):
        if self.refuse_preallocation:
            raise self.c.cuptiError(self.refuse_preallocation)
        self.preallocated = (device_buffers, semaphore_pools, list(self.enabled))

    def enable_latency_timestamps(self, enable):
        pass

    def register_callbacks(self, requested, completed):
        self.callbacks = (requested, completed)

    def check_subscriber(self):
        if self.subscriber:
            raise CuptiUnavailable(f"another CUPTI subscriber is attached ({self.subscriber})")

    def flush_all(self):
        requested, completed = self.callbacks
        size, _ = requested()
        assert size > 0
        records, self.pending = self.pending, []
        if self.deliver_late:  # the last buffer arrives after stop, from CUPTI's own thread
            half = len(records) // 2
            t = threading.Thread(target=completed, args=(records[half:],))
            completed(records[:half])
            t.start()
            t.join()
        else:
            t = threading.Thread(target=completed, args=(records,))  # CUPTI delivers on its own thread
            t.start()
            t.join()

    def timestamp(self) -> int:
        h = host_ns()
        return int(self.offset_ns + self.t0 + (h - self.t0) * (1 + self.drift))

    def push_external(self, kind, ident):
        self.stacks[kind].append(ident)

    def pop_external(self, kind):
        self.stacks[kind].pop()

    def external_kind_value(self, kind):
        return int(getattr(self.c.ExternalCorrelationKind, "CUSTOM0" if kind == "op" else "CUSTOM1"))

    def callback_name(self, domain, cbid):
        return (RUNTIME_NAMES if domain == "runtime" else DRIVER_NAMES).get(cbid, f"api{cbid}")

    def dropped_records(self):
        return self.dropped

    def enum_name(self, enum, value):
        return getattr(self.c, enum)(value).name

    # -- what "the GPU" does when the program launches work ------------------------------------
    def _api_and_externals(self, cbid: int, kind_name: str = "RUNTIME"):
        corr = self.next_corr = self.next_corr + 1
        t0 = self.timestamp()
        t1 = t0 + 3_000
        if self.enabled:
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
            for kind, stack in self.stacks.items():
                if stack:
                    self.pending.append(
                        make_record(
                            "ActivityExternalCorrelation",
                            kind=self.kind_value("EXTERNAL_CORRELATION"),
                            external_kind=self.external_kind_value(kind),
                            external_id=stack[-1],
                            correlation_id=corr,
                        )
                    )
        return corr, t1

    def launch_kernel(self, name="gemm", device=0, stream=7, duration=20_000, driver=False):
        corr, t = self._api_and_externals(307 if driver else 211, "DRIVER" if driver else "RUNTIME")
        if self.enabled:
            self.pending.append(
                make_record(
                    "ActivityKernel9",
                    kind=self.kind_value("CONCURRENT_KERNEL"),
                    name=name,
                    start=t + 5_000,
                    end=t + 5_000 + duration,
                    device_id=device,
                    context_id=1,
                    stream_id=stream,
                    correlation_id=corr,
                    registers_per_thread=32,
                    static_shared_memory=1024,
                    dynamic_shared_memory=0,
                    grid_x=64,
                    grid_y=1,
                    grid_z=1,
                    block_x=128,
                    block_y=1,
                    block_z=1,
                    graph_id=0,
                    graph_node_id=0,
                    queued=t + 1_000,
                )
            )
        return corr

    def memcpy(self, direction="HTOD", nbytes=1 << 20, device=0, stream=7):
        corr, t = self._api_and_externals(41)
        kinds = {"HTOD": ("PAGEABLE", "DEVICE"), "DTOH": ("DEVICE", "PINNED"), "DTOD": ("DEVICE", "DEVICE")}[
            direction
        ]
        if self.enabled:
            self.pending.append(
                make_record(
                    "ActivityMemcpy5",
                    kind=self.kind_value("MEMCPY"),
                    copy_kind=int(getattr(self.c.ActivityMemcpyKind, direction)),
                    src_kind=int(getattr(self.c.ActivityMemoryKind, kinds[0])),
                    dst_kind=int(getattr(self.c.ActivityMemoryKind, kinds[1])),
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
        if self.enabled:
            self.pending.append(
                make_record(
                    "ActivityMemset4",
                    kind=self.kind_value("MEMSET"),
                    bytes=nbytes,
                    value=0,
                    memory_kind=int(self.c.ActivityMemoryKind.DEVICE),
                    start=t + 2_000,
                    end=t + 3_000,
                    device_id=device,
                    context_id=1,
                    stream_id=stream,
                    correlation_id=corr,
                )
            )
        return corr

    def synchronize(self, stream=7):
        corr, t = self._api_and_externals(131)
        if self.enabled:
            self.pending.append(
                make_record(
                    "ActivitySynchronization",
                    kind=self.kind_value("SYNCHRONIZATION"),
                    type=int(self.c.ActivitySynchronizationType.STREAM_SYNCHRONIZE),
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
        if self.enabled:
            for i in range(nodes):
                self.pending.append(
                    make_record(
                        "ActivityKernel9",
                        kind=self.kind_value("CONCURRENT_KERNEL"),
                        name=f"graph_node_{i}",
                        start=t + 10_000 * (i + 1),
                        end=t + 10_000 * (i + 1) + 5_000,
                        device_id=device,
                        context_id=1,
                        stream_id=stream,
                        correlation_id=corr,
                        registers_per_thread=16,
                        static_shared_memory=0,
                        dynamic_shared_memory=0,
                        grid_x=1,
                        grid_y=1,
                        grid_z=1,
                        block_x=32,
                        block_y=1,
                        block_z=1,
                        graph_id=5,
                        graph_node_id=100 + i,
                    )
                )
        return corr

    def uninteresting_api(self):
        return self._api_and_externals(10)[0]
