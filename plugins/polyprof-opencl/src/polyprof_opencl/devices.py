"""OpenCL platforms and devices as polyprof sees them: a flat, stable device index."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DeviceInfo:
    index: int  # position in the flat list over all platforms: what users pass as "devices"
    platform_index: int
    device: Any  # pyopencl.Device
    name: str
    platform: str
    vendor: str
    version: str
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"opencl:{self.index}"

    def describe(self) -> str:
        return f"[{self.index}] {self.name} ({self.platform}, {self.version})"


def _info(device: Any, attr: str, default: Any = None) -> Any:
    try:
        return getattr(device, attr)
    except Exception:
        return default


def list_devices(cl: Any) -> list[DeviceInfo]:
    """Every device of every platform. Raises pyopencl's error when no platform can be listed."""
    devices: list[DeviceInfo] = []
    for p_index, platform in enumerate(cl.get_platforms()):
        try:
            platform_devices = platform.get_devices()
        except cl.Error:
            continue  # a platform with no devices of any type
        for device in platform_devices:
            name = str(_info(device, "name", "unknown")).strip()
            props = {
                "vendor": str(_info(device, "vendor", "")).strip(),
                "version": str(_info(device, "version", "")).strip(),
                "driverVersion": str(_info(device, "driver_version", "")).strip(),
                "platform": str(platform.name).strip(),
                "computeUnits": _info(device, "max_compute_units", 0),
                "totalGlobalMem": _info(device, "global_mem_size", 0),
                "localMemSize": _info(device, "local_mem_size", 0),
                "maxWorkGroupSize": _info(device, "max_work_group_size", 0),
                "maxClockFrequency": _info(device, "max_clock_frequency", 0),
                "profilingTimerResolution": _info(device, "profiling_timer_resolution", 0),
            }
            devices.append(
                DeviceInfo(
                    index=len(devices),
                    platform_index=p_index,
                    device=device,
                    name=name,
                    platform=props["platform"],
                    vendor=props["vendor"],
                    version=props["version"],
                    properties=props,
                )
            )
    return devices
