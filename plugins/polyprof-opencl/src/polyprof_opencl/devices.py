"""OpenCL platforms and devices as polyprof sees them: a flat, stable device index over all platforms
(what users pass as ``backend_options={"opencl": {"devices": [...]}}``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: deviceProperties key -> pyopencl.Device attribute
PROPERTIES = {"vendor": "vendor", "version": "version", "driverVersion": "driver_version",
              "computeUnits": "max_compute_units", "totalGlobalMem": "global_mem_size",
              "localMemSize": "local_mem_size", "maxWorkGroupSize": "max_work_group_size",
              "maxClockFrequency": "max_clock_frequency", "profilingTimerResolution": "profiling_timer_resolution"}


@dataclass
class DeviceInfo:
    index: int
    device: Any  # pyopencl.Device
    name: str
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"opencl:{self.index}"

    def describe(self) -> str:
        return f"[{self.index}] {self.name} ({self.properties['platform']}, {self.properties['version']})"


def _info(device: Any, attr: str) -> Any:
    try:
        value = getattr(device, attr)
    except Exception:  # an attribute this device or driver does not support
        return ""
    return value.strip() if isinstance(value, str) else value


def list_devices(cl: Any) -> list[DeviceInfo]:
    """Every device of every platform. Raises pyopencl's error when no platform can be listed."""
    devices: list[DeviceInfo] = []
    for platform in cl.get_platforms():
        try:
            found = platform.get_devices()
        except cl.Error:
            continue  # a platform with no devices of any type
        for device in found:
            props = {key: _info(device, attr) for key, attr in PROPERTIES.items()}
            props["platform"] = str(platform.name).strip()
            devices.append(DeviceInfo(len(devices), device, str(_info(device, "name") or "unknown"), props))
    return devices
