"""The ``nvml`` backend: NVIDIA GPU counters through NVML (``nvidia-ml-py``), as counter tracks on
each GPU's process (activity group CUDA, beside the ``cuda`` backend's kernels).

::

    pip install './plugins/polyprof-cuda[nvml]'
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 backend_options={"nvml": {"interval_ms": 50}}) as prof: ...

One daemon thread (``polyprof-nvml``) samples every ``interval_ms`` (default 100) while the profile
records: ``SM utilisation %``, ``memory utilisation %``, ``memory used (MB)``, ``power (W)``, ``SM clock
(MHz)``, ``temperature (C)``, ``PCIe TX (MB/s)`` / ``PCIe RX (MB/s)``, and ``NVLink TX (MB/s)`` /
``NVLink RX (MB/s)`` where the device counts them (the first read of a counter a device does not
support drops that counter for it, said in the backend's status under ``unsupported``). The GPUs are
named ``cuda:N`` in NVML's order (PCI bus order): with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (or one GPU)
that is CUDA's order too, so the tracks land on the ``cuda`` backend's GPU processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polyprof.plugin import Availability
from polyprof.plugin.counters import CounterBackend, DeviceCounterSession

THREAD_NAME = "polyprof-nvml"
MB = 1e6


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def counters_of(nvml: Any) -> list[tuple[str, Callable[[Any], float]]]:
    """(track name, read(handle) -> value) for every counter this backend samples."""
    field_ids = [getattr(nvml, n, None) for n in ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")]

    def nvlink(which: int) -> Callable[[Any], float]:
        def read(h: Any) -> float:
            if field_ids[which] is None:
                raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
            (value,) = nvml.nvmlDeviceGetFieldValues(h, [field_ids[which]])
            if value.nvmlReturn != nvml.NVML_SUCCESS:
                raise nvml.NVMLError(value.nvmlReturn)
            return value.value.ullVal * 1024 / MB  # KiB counted since boot: written as a rate

        return read

    return [
        ("SM utilisation %", lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
        ("memory utilisation %", lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).memory)),
        ("memory used (MB)", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / MB),
        ("power (W)", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
        ("SM clock (MHz)", lambda h: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))),
        ("temperature (C)", lambda h: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))),
        ("PCIe TX (MB/s)", lambda h: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES) * 1024 / MB),
        ("PCIe RX (MB/s)", lambda h: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES) * 1024 / MB),
        ("NVLink TX (MB/s)", nvlink(0)),
        ("NVLink RX (MB/s)", nvlink(1)),
    ]


RATES = ("NVLink TX (MB/s)", "NVLink RX (MB/s)")  # read as totals, written as rates


class NvmlSession(DeviceCounterSession):
    thread_name, device_prefix, rates = THREAD_NAME, "cuda", RATES

    def open(self) -> list[tuple[int, Any, str]]:
        self.nvml = _import_nvml()
        self.errors = (self.nvml.NVMLError,)
        self.nvml.nvmlInit()
        gpus = []
        for i in range(self.nvml.nvmlDeviceGetCount()):
            h = self.nvml.nvmlDeviceGetHandleByIndex(i)
            name = self.nvml.nvmlDeviceGetName(h)
            gpus.append((i, h, name.decode() if isinstance(name, bytes) else str(name)))
        return gpus

    def shut(self) -> None:
        self.nvml.nvmlShutdown()

    def counters(self) -> list[tuple[str, Callable[[Any], float]]]:
        return counters_of(self.nvml)

    def why(self, exc: BaseException) -> str:
        return "not supported" if getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", -1) else str(exc)


class NvmlBackend(CounterBackend):
    name, activities, session_class = "nvml", frozenset({"CUDA"}), NvmlSession

    def probe(self) -> Availability:
        try:
            nvml = _import_nvml()
        except ImportError:
            return Availability.no("needs nvidia-ml-py: pip install 'polyprof-cuda[nvml]'")
        try:
            nvml.nvmlInit()
        except Exception as exc:
            return Availability.no(f"NVML did not start ({exc}): no NVIDIA driver on this machine?")
        try:
            count = nvml.nvmlDeviceGetCount()
            names = []
            for i in range(count):
                n = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
                names.append(n.decode() if isinstance(n, bytes) else str(n))
            driver = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
        if not count:
            return Availability.no("NVML sees no GPU")
        return Availability.yes(devices=[f"GPU {i}: {n}" for i, n in enumerate(names)],
                                driver=driver.decode() if isinstance(driver, bytes) else str(driver))



backend = NvmlBackend()
