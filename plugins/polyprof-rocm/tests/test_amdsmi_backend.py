"""The amdsmi backend against a stand-in for the AMD SMI functions it calls (the Python bindings' names
and shapes, per AMD's documentation): two GPUs, the second without power and clock readings."""

import sys
import time
import types

import polyprof


def fake_amdsmi(fail_init=False):
    m = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    m.AmdSmiException = AmdSmiException
    m.AmdSmiInitFlags = types.SimpleNamespace(INIT_AMD_GPUS=2)
    m.AmdSmiClkType = types.SimpleNamespace(GFX=0)
    m.AmdSmiTemperatureType = types.SimpleNamespace(EDGE=0)
    m.AmdSmiTemperatureMetric = types.SimpleNamespace(CURRENT=0)
    state = {"init": 0}

    def init(flags):
        if fail_init:
            raise AmdSmiException("AMDSMI_STATUS_INIT_ERROR")
        state["init"] += 1

    m.amdsmi_init = init
    m.amdsmi_shut_down = lambda: state.__setitem__("init", state["init"] - 1)
    m.amdsmi_get_processor_handles = lambda: ["gpu0", "gpu1"]
    m.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "AMD Instinct MI300X" if h == "gpu0" else "Radeon PRO W7900"}
    m.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": 87 if h == "gpu0" else 12, "umc_activity": 40, "mm_activity": 0}
    m.amdsmi_get_gpu_vram_usage = lambda h: {"vram_used": 65536, "vram_total": 196608}

    def power(h):
        if h == "gpu1":
            raise AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")
        return {"current_socket_power": 640, "average_socket_power": 600}

    m.amdsmi_get_power_info = power
    m.amdsmi_get_clock_info = lambda h, kind: {"clk": 2100} if h == "gpu0" else {"clk": "N/A"}
    m.amdsmi_get_temp_metric = lambda h, sensor, metric: 55
    m.state = state
    return m


def test_gpu_counters_on_each_gpus_process(monkeypatch):
    smi = fake_amdsmi()
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    with polyprof.profile(["cpu", "rocm"], backend_options={"amdsmi": {"interval_ms": 10}}) as prof:
        time.sleep(0.15)
    trace = prof.trace
    cols, names = trace.counters.columns, trace.counters.strings.strings
    by = {}
    for code, dev, value in zip(cols["name"].tolist(), cols["device"].tolist(), cols["value"].tolist(), strict=True):
        by.setdefault((trace.devices[dev].key, names[code]), []).append(value)
    assert by[("rocm:0", "GFX activity %")][0] == 87 and by[("rocm:1", "GFX activity %")][0] == 12
    assert by[("rocm:0", "power (W)")][0] == 640 and ("rocm:1", "power (W)") not in by
    assert by[("rocm:0", "GFX clock (MHz)")][0] == 2100 and ("rocm:1", "GFX clock (MHz)") not in by, "N/A is no number"
    assert len(by[("rocm:1", "temperature (C)")]) >= 5
    assert {d.name for d in trace.devices if d.key.startswith("rocm:")} == {"AMD Instinct MI300X", "Radeon PRO W7900"}
    unsupported = trace.backends["amdsmi"].details["unsupported"]["GPU 1"]
    assert any(u.startswith("power (W): AmdSmiException") for u in unsupported)
    assert smi.state["init"] == 0, "every amdsmi_init has its amdsmi_shut_down"


def test_availability_says_why_not(monkeypatch):
    from polyprof_rocm.amdsmi_backend import backend

    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert "amdsmi package of a ROCm install" in backend.probe().reason
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(fail_init=True))
    assert "AMD SMI did not start" in backend.probe().reason
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi())
    assert backend.probe().devices == ("GPU 0: AMD Instinct MI300X", "GPU 1: Radeon PRO W7900")
