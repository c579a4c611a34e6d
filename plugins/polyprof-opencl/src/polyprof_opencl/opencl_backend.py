"""The ``opencl`` backend: probe, options, sessions. pyopencl is imported only here, lazily."""

from __future__ import annotations

from typing import Any

from polyprof.plugin import (
    API_VERSION,
    Availability,
    ConfigError,
    Option,
    OptionSchema,
    ProfileConfig,
    SessionContext,
)

INSTALL_HINT = "pip install 'polyprof-opencl[pocl]' for a CPU device, or install your GPU vendor's OpenCL driver"


def _import_pyopencl() -> Any:
    import pyopencl

    return pyopencl


class OpenCLBackend:
    """OpenCL kernels, copies, fills and map/unmap on every device pyopencl sees (group OPENCL)."""

    name = "opencl"
    api_version = API_VERSION
    activities = frozenset({"OPENCL"})
    #: what ``backend_options={"opencl": {...}}`` may hold (checked by the engine)
    options = OptionSchema(Option("devices", list, items=int, help="indices of the devices to trace (default all)"))

    def _devices(self) -> tuple[Any, list]:
        from polyprof_opencl.devices import list_devices

        cl = _import_pyopencl()
        return cl, list_devices(cl)

    def probe(self) -> Availability:
        """Available when pyopencl imports and lists at least one device; otherwise why not."""
        try:
            cl = _import_pyopencl()
        except ImportError as exc:
            return Availability.no(f"pyopencl cannot be imported ({exc}): {INSTALL_HINT}")
        versions = {"pyopencl": cl.VERSION_TEXT}
        try:
            _, devices = self._devices()
        except Exception as exc:
            if "PLATFORM_NOT_FOUND" in str(exc) or "platform" in str(exc).lower():
                return Availability.no(
                    f"the OpenCL ICD loader found no platform ({exc}): no OpenCL driver is installed or "
                    f"registered (OCL_ICD_VENDORS, /etc/OpenCL/vendors): {INSTALL_HINT}", **versions
                )
            return Availability.no(f"listing OpenCL platforms failed: {exc}", **versions)
        if not devices:
            platforms = ", ".join(p.name for p in cl.get_platforms())
            return Availability.no(f"OpenCL platform(s) {platforms} found, but no devices", **versions)
        return Availability.yes(devices=[d.describe() for d in devices], **versions)

    def check_options(self, options: dict) -> None:
        """The device indices exist (the schema checked the types)."""
        wanted = options.get("devices")
        devices = self._devices()[1] if wanted is not None else []
        missing = [i for i in wanted or () if not 0 <= i < len(devices)]
        if missing:
            listing = "; ".join(d.describe() for d in devices) or "none"
            raise ConfigError(f"opencl: device index {missing[0]} does not exist. Devices: {listing}")

    def profile_started(self, config: ProfileConfig) -> None:
        """For the whole profile (every step of a schedule), queues created are profiling-enabled."""
        from polyprof_opencl.intercept import hold_queue_profiling

        hold_queue_profiling(_import_pyopencl())

    def profile_stopped(self) -> None:
        from polyprof_opencl.intercept import hold_queue_profiling

        hold_queue_profiling(_import_pyopencl(), hold=False)

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_opencl.session import OpenCLSession

        cl, devices = self._devices()
        return OpenCLSession(cl, devices, config, ctx)


backend = OpenCLBackend()
