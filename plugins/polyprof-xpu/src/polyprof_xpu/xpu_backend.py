"""The ``xpu`` backend: probe, options, sessions."""

from __future__ import annotations

from typing import Any

from polyprof.backend import (
    API_VERSION,
    Availability,
    ProfileConfig,
    SessionContext,
    reject_unknown_options,
    require_int_options,
)
from polyprof.errors import ConfigError

KNOWN_OPTIONS = {"views", "buffer_kb", "max_buffers", "runtime_apis"}


class XpuBackend:
    """Intel GPUs through PTI's View API (activity group XPU).

    Options (``backend_options={"xpu": {...}}``): ``views`` (names, default kernel, memcpy, memcpy_p2p,
    memset, runtime, driver, sync, external_correlation, overhead; ``communication`` for oneCCL),
    ``runtime_apis`` (``"gpu_operations"``, the default, keeps work-submitting calls; ``"all"``),
    ``buffer_kb`` (4096), ``max_buffers`` (1024 per session; buffers PTI asks for beyond it are refused,
    and the records PTI could not store are lost, which the trace reports).
    """

    name = "xpu"
    api_version = API_VERSION
    activities = frozenset({"XPU"})

    def __init__(self) -> None:
        self.loaded_after_sycl = False

    def _library(self) -> Any:
        from polyprof_xpu.library import load, sycl_already_loaded

        sycl_before = sycl_already_loaded()
        lib = load()
        self.loaded_after_sycl = self.loaded_after_sycl or (sycl_before and not getattr(lib, "_early", False))
        lib._early = True
        return lib

    def probe(self) -> Availability:
        from polyprof_xpu.library import PtiUnavailable

        try:
            lib = self._library()
            lib.gpu_local_available()
        except PtiUnavailable as exc:
            return Availability.no(str(exc))
        except Exception as exc:
            return Availability.no(f"PTI probe failed: {type(exc).__name__}: {exc}")
        return Availability.yes(devices=["Intel GPU(s) through Level Zero"], pti=lib.version_string)

    def check_options(self, options: dict) -> None:
        from polyprof_xpu.session import ALL_VIEWS

        reject_unknown_options("xpu", options, KNOWN_OPTIONS)
        bad = [v for v in options.get("views", ()) if v not in ALL_VIEWS]
        if bad:
            raise ConfigError(f"xpu: unknown view(s) {bad}; views: {', '.join(ALL_VIEWS)}")
        if options.get("runtime_apis", "gpu_operations") not in ("gpu_operations", "all"):
            raise ConfigError("xpu: 'runtime_apis' must be 'gpu_operations' or 'all'")
        require_int_options("xpu", options, ("buffer_kb", "max_buffers"), minimum=1)

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_xpu.session import XpuSession

        return XpuSession(self._library(), config, ctx, loaded_after_sycl=self.loaded_after_sycl)


backend = XpuBackend()
