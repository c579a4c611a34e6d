"""The ``cuda`` backend: probe, options, sessions. cupti-python is imported only here, lazily."""

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

KNOWN_OPTIONS = {
    "kinds",
    "buffer_size_mb",
    "max_records",
    "apis",
    "latency_timestamps",
    "preallocate_device_buffers",
    "preallocate_semaphore_pools",
}


def make_layer() -> Any:
    from polyprof_cuda.cupti_layer import CuptiLayer

    return CuptiLayer()


class CudaBackend:
    """NVIDIA GPUs through CUPTI's Activity API (activity group CUDA).

    Options (``backend_options={"cuda": {...}}``): ``kinds`` (CUPTI activity kind names, default
    kernels, copies, fills, runtime, driver, syncs, overhead), ``apis`` (``"default"``: launch, copy,
    fill, sync and graph calls; ``"all"``), ``buffer_size_mb`` (8), ``max_records`` (20,000,000; more
    are counted as dropped), ``latency_timestamps`` (False; adds kernels' ``queued``),
    ``preallocate_device_buffers`` and ``preallocate_semaphore_pools`` (2 each: allocated by CUPTI when it
    sets up a context, not inside the traced window; 0 leaves CUPTI's lazy default).
    """

    name = "cuda"
    api_version = API_VERSION
    activities = frozenset({"CUDA"})

    def __init__(self, layer_factory: Any = make_layer) -> None:
        self.layer_factory = layer_factory

    def probe(self) -> Availability:
        from polyprof_cuda.cupti_layer import CuptiUnavailable

        try:
            layer = self.layer_factory()
            layer.check_ready()
            devices = layer.devices()
        except CuptiUnavailable as exc:
            return Availability.no(str(exc))
        except Exception as exc:
            return Availability.no(f"CUPTI probe failed: {type(exc).__name__}: {exc}")
        return Availability.yes(
            devices=[f"[{d.index}] {d.name}" for d in devices], cupti_python=layer.package_version()
        )

    def check_options(self, options: dict) -> None:
        reject_unknown_options("cuda", options, KNOWN_OPTIONS)
        from polyprof_cuda.records import KIND_FAMILIES

        bad = [k for k in options.get("kinds", ()) if k not in KIND_FAMILIES]
        if bad:
            raise ConfigError(
                f"cuda: unsupported activity kind(s) {bad}; supported: {', '.join(KIND_FAMILIES)}"
            )
        if options.get("apis", "default") not in ("default", "all"):
            raise ConfigError("cuda: 'apis' must be 'default' or 'all'")
        require_int_options("cuda", options, ("buffer_size_mb", "max_records"), minimum=1)
        require_int_options(
            "cuda", options, ("preallocate_device_buffers", "preallocate_semaphore_pools"), minimum=0
        )

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_cuda.session import CudaSession

        layer = self.layer_factory()
        return CudaSession(layer, layer.devices(), config, ctx)


backend = CudaBackend()
