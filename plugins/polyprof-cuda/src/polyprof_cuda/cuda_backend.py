"""The ``cuda`` backend: probe, options, sessions. cupti-python is imported only here, lazily."""

from __future__ import annotations

from typing import Any

from polyprof.plugin import (
    API_VERSION,
    CUPTI,
    Availability,
    BackendTraits,
    Option,
    OptionSchema,
    ProfileConfig,
    SessionContext,
)


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
    traits = BackendTraits(facilities=frozenset({CUPTI}))  # one subscriber per process; shared with torch's collector

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

    @property
    def options(self) -> OptionSchema:
        """What ``backend_options={"cuda": {...}}`` may hold (checked by the engine before it starts)."""
        from polyprof_cuda.records import KIND_FAMILIES

        return OptionSchema(
            Option("kinds", list, items=str, choices=tuple(KIND_FAMILIES), help="CUPTI activity kinds"),
            Option("apis", str, choices=("default", "all"), help="runtime/driver calls kept"),
            Option("buffer_size_mb", int, minimum=1, help="size of each CUPTI buffer (default 8)"),
            Option("max_records", int, minimum=1, help="records kept; more are counted as dropped"),
            Option("latency_timestamps", bool, help="kernels' queued time"),
            Option("preallocate_device_buffers", int, minimum=0),
            Option("preallocate_semaphore_pools", int, minimum=0),
        )

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_cuda.session import CudaSession

        layer = self.layer_factory()
        return CudaSession(layer, layer.devices(), config, ctx)


backend = CudaBackend()
