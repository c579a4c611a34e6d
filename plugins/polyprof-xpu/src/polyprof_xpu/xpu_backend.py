"""The ``xpu`` backend: probe, options, sessions."""

from __future__ import annotations

from typing import Any

from polyprof.plugin import API_VERSION, Availability, Option, OptionSchema, ProfileConfig, SessionContext


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

    @property
    def options(self) -> OptionSchema:
        """What ``backend_options={"xpu": {...}}`` may hold (checked by the engine before it starts)."""
        from polyprof_xpu.session import ALL_VIEWS

        return OptionSchema(
            Option("views", list, items=str, choices=tuple(ALL_VIEWS), help="PTI views enabled"),
            Option("runtime_apis", str, choices=("gpu_operations", "all"), help="runtime calls kept"),
            Option("buffer_kb", int, minimum=1, help="size of each PTI buffer (default 4096)"),
            Option("max_buffers", int, minimum=1, help="buffers per session; more are refused"),
        )

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_xpu.session import XpuSession

        return XpuSession(self._library(), config, ctx, loaded_after_sycl=self.loaded_after_sycl)


backend = XpuBackend()
