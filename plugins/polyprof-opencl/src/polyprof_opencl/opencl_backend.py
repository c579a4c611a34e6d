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

INSTALL_HINT = (
    "pip install 'polyprof-opencl[pocl]' for a CPU device, or install your GPU vendor's OpenCL driver"
)


def _import_pyopencl() -> Any:
    import pyopencl

    return pyopencl


class OpenCLBackend:
    """OpenCL kernels, copies, fills and map/unmap on every device pyopencl sees (group OPENCL).

    Options (``backend_options={"opencl": {...}}``): ``devices``: list of device indices to profile
    (as listed by ``polyprof backends``); default all.
    """

    name = "opencl"
    api_version = API_VERSION
    activities = frozenset({"OPENCL"})

    def _devices(self) -> tuple[Any, list]:
        from polyprof_opencl.devices import list_devices

        cl = _import_pyopencl()
        return cl, list_devices(cl)

    def probe(self) -> Availability:
        try:
            cl = _import_pyopencl()
        except ImportError as exc:
            return Availability.no(f"pyopencl cannot be imported ({exc}): {INSTALL_HINT}")
        try:
            _, devices = self._devices()
        except Exception as exc:
            text = str(exc)
            if "PLATFORM_NOT_FOUND" in text or "platform" in text.lower():
                return Availability.no(
                    f"the OpenCL ICD loader found no platform ({text}): no OpenCL driver is installed or "
                    f"registered (OCL_ICD_VENDORS, /etc/OpenCL/vendors): {INSTALL_HINT}",
                    pyopencl=cl.VERSION_TEXT,
                )
            return Availability.no(f"listing OpenCL platforms failed: {text}", pyopencl=cl.VERSION_TEXT)
        if not devices:
            platforms = ", ".join(p.name for p in cl.get_platforms())
            return Availability.no(
                f"OpenCL platform(s) {platforms} found, but no devices", pyopencl=cl.VERSION_TEXT
            )
        return Availability.yes(devices=[d.describe() for d in devices], pyopencl=cl.VERSION_TEXT)

    #: what ``backend_options={"opencl": {...}}`` may hold (checked by the engine)
    options = OptionSchema(Option("devices", list, items=int, help="indices of the devices to trace"))

    def check_options(self, options: dict) -> None:
        """The device indices exist (the schema checked the types)."""
        wanted = options.get("devices")
        if wanted is None:
            return
        _, devices = self._devices()
        missing = [i for i in wanted if not 0 <= i < len(devices)]
        if missing:
            listing = "; ".join(d.describe() for d in devices) or "none"
            raise ConfigError(f"opencl: device index {missing[0]} does not exist. Devices: {listing}")

    def profile_started(self, config: ProfileConfig) -> None:
        """For the whole profile (every step of a schedule), queues created are profiling-enabled."""
        from polyprof_opencl.intercept import hold_queue_profiling

        hold_queue_profiling(_import_pyopencl())

    def profile_stopped(self) -> None:
        from polyprof_opencl.intercept import release_queue_profiling

        release_queue_profiling(_import_pyopencl())

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_opencl.session import OpenCLSession

        cl, devices = self._devices()
        return OpenCLSession(cl, devices, config, ctx)


backend = OpenCLBackend()
