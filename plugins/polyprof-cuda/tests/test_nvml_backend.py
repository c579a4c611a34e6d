"""The nvml backend against a stand-in for the NVML functions it calls (pynvml's names and shapes):
two GPUs, the second without NVLink or PCIe counters. The real library runs in
scripts/device-check.py on a GPU."""

import sys
import types

import pytest

import polyprof


def fake_pynvml(fail_init=False):
    m = types.ModuleType("pynvml")
    m.NVML_SUCCESS, m.NVML_ERROR_NOT_SUPPORTED = 0, 3
    m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_GPU = 1, 0
    m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
    m.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, m.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
    state = {"init": 0, "reads": 0}

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    m.NVMLError = NVMLError

    def init():
        if fail_init:
            raise NVMLError(9)
        state["init"] += 1

    m.nvmlInit = init
    m.nvmlShutdown = lambda: state.__setitem__("init", state["init"] - 1)
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA L4"
    m.nvmlSystemGetDriverVersion = lambda: "580.82"
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 - 40 * h, memory=30)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2_000_000_000, total=141_000_000_000)
    m.nvmlDeviceGetPowerUsage = lambda h: 550_000 if h == 0 else 70_000
    m.nvmlDeviceGetClockInfo = lambda h, which: 1980
    m.nvmlDeviceGetTemperature = lambda h, which: 61

    def pcie(h, which):
        if h == 1:
            raise NVMLError(m.NVML_ERROR_NOT_SUPPORTED)
        return 4000  # KB/s

    m.nvmlDeviceGetPcieThroughput = pcie

    def fields(h, ids):
        if h == 1:
            raise NVMLError(m.NVML_ERROR_NOT_SUPPORTED)
        state["reads"] += 1
        total = state["reads"] * 1_000_000  # KiB since boot, growing
        return [types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(ullVal=total)) for _ in ids]

    m.nvmlDeviceGetFieldValues = fields
    m.state = state
    return m


def test_gpu_counters_on_each_gpus_process(monkeypatch):
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    import time

    with polyprof.profile(["cpu", "cuda"], backend_options={"nvml": {"interval_ms": 10}}) as prof:
        time.sleep(0.2)
    trace = prof.trace
    cols, names = trace.counters.columns, trace.counters.strings.strings
    by = {}
    for code, dev, value in zip(cols["name"].tolist(), cols["device"].tolist(), cols["value"].tolist(), strict=True):
        by.setdefault((trace.devices[dev].key, names[code]), []).append(value)
    assert by[("cuda:0", "SM utilisation %")][0] == 90 and by[("cuda:1", "SM utilisation %")][0] == 50
    assert by[("cuda:0", "power (W)")][0] == 550 and by[("cuda:1", "memory used (MB)")][0] == 4000
    assert by[("cuda:0", "PCIe TX (MB/s)")][0] == pytest.approx(4.096)
    assert ("cuda:1", "PCIe TX (MB/s)") not in by and ("cuda:1", "NVLink TX (MB/s)") not in by
    assert all(v > 0 for v in by[("cuda:0", "NVLink TX (MB/s)")]), "totals become rates"
    assert len(by[("cuda:0", "temperature (C)")]) >= 5
    assert {d.name for d in trace.devices if d.key.startswith("cuda:")} == {"NVIDIA H200", "NVIDIA L4"}
    status = trace.backends["nvml"]
    assert any("PCIe TX (MB/s): not supported" in u for u in status.details["unsupported"]["GPU 1"])
    assert nvml.state["init"] == 0, "every nvmlInit has its nvmlShutdown"


def test_availability_says_why_not(monkeypatch):
    from polyprof_cuda.nvml_backend import backend

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "pip install 'polyprof-cuda[nvml]'" in backend.probe().reason
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    assert "NVML did not start" in backend.probe().reason
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    avail = backend.probe()
    assert avail.available and avail.devices == ("GPU 0: NVIDIA H200", "GPU 1: NVIDIA L4")
