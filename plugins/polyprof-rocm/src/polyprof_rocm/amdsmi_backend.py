"""The ``amdsmi`` backend: AMD GPU counters through AMD SMI's Python bindings (``amdsmi``, shipped with
ROCm), as counter tracks on each GPU's process (activity group ROCM).

::

    with polyprof.profile(["cpu", "rocm"], backend_options={"amdsmi": {"interval_ms": 50}}) as prof: ...

One daemon thread (``polyprof-amdsmi``) samples every ``interval_ms`` (default 100) while the profile
records: ``GFX activity %``, ``memory activity %`` (UMC), ``VRAM used (MB)``, ``power (W)``, ``GFX clock
(MHz)``, ``temperature (C)`` (edge sensor). Units as AMD SMI's documentation gives them (power in W,
VRAM in MB, temperatures in C). A counter a GPU does not support is dropped for it at its first read
and named in the backend's status under ``unsupported``. The GPUs are named ``rocm:N`` in amdsmi's
order. **Not yet run on AMD hardware**: tested against a stand-in for the amdsmi functions it calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polyprof.plugin import Availability
from polyprof.plugin.counters import CounterBackend, DeviceCounterSession

THREAD_NAME = "polyprof-amdsmi"


def _import_amdsmi() -> Any:
    import amdsmi

    return amdsmi


def counters_of(smi: Any) -> list[tuple[str, Callable[[Any], float]]]:
    """(track name, read(handle) -> value) for every counter this backend samples."""
    return [
        ("GFX activity %", lambda h: float(smi.amdsmi_get_gpu_activity(h)["gfx_activity"])),
        ("memory activity %", lambda h: float(smi.amdsmi_get_gpu_activity(h)["umc_activity"])),
        ("VRAM used (MB)", lambda h: float(smi.amdsmi_get_gpu_vram_usage(h)["vram_used"])),
        ("power (W)", lambda h: float(smi.amdsmi_get_power_info(h)["current_socket_power"])),
        ("GFX clock (MHz)", lambda h: float(smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)["clk"])),
        ("temperature (C)", lambda h: float(smi.amdsmi_get_temp_metric(h, smi.AmdSmiTemperatureType.EDGE,
                                                                         smi.AmdSmiTemperatureMetric.CURRENT))),
    ]


def _names(smi: Any) -> list[tuple[Any, str]]:
    out = []
    for h in smi.amdsmi_get_processor_handles():
        try:
            name = smi.amdsmi_get_gpu_asic_info(h).get("market_name") or "AMD GPU"
        except Exception:
            name = "AMD GPU"
        out.append((h, str(name)))
    return out


class AmdSmiSession(DeviceCounterSession):
    thread_name, device_prefix = THREAD_NAME, "rocm"

    def open(self) -> list[tuple[int, Any, str]]:
        self.smi = _import_amdsmi()
        self.errors = (self.smi.AmdSmiException, KeyError, TypeError, ValueError)  # ValueError: "N/A"
        self.smi.amdsmi_init(self.smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        return [(i, h, name) for i, (h, name) in enumerate(_names(self.smi))]

    def shut(self) -> None:
        self.smi.amdsmi_shut_down()

    def counters(self) -> list[tuple[str, Callable[[Any], float]]]:
        return counters_of(self.smi)


class AmdSmiBackend(CounterBackend):
    name, activities, session_class = "amdsmi", frozenset({"ROCM"}), AmdSmiSession

    def probe(self) -> Availability:
        try:
            smi = _import_amdsmi()
        except ImportError:
            return Availability.no("needs AMD SMI's Python bindings (the amdsmi package of a ROCm install)")
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except Exception as exc:
            return Availability.no(f"AMD SMI did not start ({exc}): no AMD GPU driver (amdgpu) on this machine?")
        try:
            gpus = _names(smi)
        finally:
            smi.amdsmi_shut_down()
        if not gpus:
            return Availability.no("AMD SMI sees no GPU")
        return Availability.yes(devices=[f"GPU {i}: {name}" for i, (_, name) in enumerate(gpus)])



backend = AmdSmiBackend()
