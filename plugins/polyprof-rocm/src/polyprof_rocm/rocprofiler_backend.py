"""The ``rocm`` backend: AMD GPU kernels, memory copies and HIP runtime calls through rocprofiler-sdk's
buffer tracing (activity group ROCM).

::

    with polyprof.profile(["cpu", "rocm"]) as prof:
        train()

Options (``backend_options={"rocm": {...}}``): ``kinds`` (default kernel, memcpy, hip_runtime; also hsa
and marker), ``runtime_apis`` (``"gpu_operations"``, the default, keeps HIP calls that launched device
work and synchronisations; ``"all"``). polyprof registers with rocprofiler-sdk at the first profile that
uses this backend (``rocprofiler_force_configure``), once per process: the services configured then
stay for the process's life. **Not yet run on AMD hardware**: tested against a compiled double of the
rocprofiler-sdk entry points it calls.
"""

from __future__ import annotations

from typing import Any

from polyprof.plugin import API_VERSION, Availability, Option, OptionSchema, ProfileConfig, SessionContext


class RocprofilerBackend:
    name = "rocm"
    api_version = API_VERSION
    activities = frozenset({"ROCM"})

    def probe(self) -> Availability:
        from polyprof_rocm.rocprofiler_library import INSTALL_HINT, RocprofilerUnavailable, load

        try:
            lib = load()
            agents = lib.gpu_agents()
        except RocprofilerUnavailable as exc:
            return Availability.no(str(exc))
        except Exception as exc:  # noqa: BLE001 - a probe reports, never raises
            return Availability.no(f"rocprofiler-sdk probe failed: {type(exc).__name__}: {exc}")
        if not agents:
            return Availability.no(
                f"rocprofiler-sdk {lib.version_string} sees no AMD GPU (no ROCm driver, or HIP_VISIBLE_DEVICES "
                f"hides them): {INSTALL_HINT}"
            )
        names = [f"GPU {a['logical_node_type_id']}: {a['product'] or a['name']}" for a in agents]
        return Availability.yes(devices=names, rocprofiler_sdk=lib.version_string)

    @property
    def options(self) -> OptionSchema:
        from polyprof_rocm.rocprofiler_session import KINDS

        return OptionSchema(
            Option("kinds", list, items=str, choices=tuple(KINDS), help="buffer tracing services (default kernel, memcpy, hip_runtime)"),
            Option("runtime_apis", str, choices=("gpu_operations", "all"), help="HIP runtime calls kept"),
        )

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof_rocm.rocprofiler_library import tool
        from polyprof_rocm.rocprofiler_session import RocprofilerSession

        return RocprofilerSession(tool, config, ctx)


backend = RocprofilerBackend()
