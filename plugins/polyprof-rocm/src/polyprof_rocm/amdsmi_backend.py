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

from polyprof.plugin import (
    API_VERSION,
    Availability,
    CounterSampler,
    Option,
    OptionSchema,
    ProfileConfig,
    SessionContext,
    Sink,
)

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
    ]  # fmt: skip


class GpuReader:
    def __init__(self, smi: Any, handles: list[tuple[int, Any]]) -> None:
        self.smi = smi
        self.handles = handles
        self.live = {i: counters_of(smi) for i, _ in handles}
        self.unsupported: dict[int, list[str]] = {}

    def read(self) -> list[tuple[int, str, float]]:
        out = []
        for i, h in self.handles:
            for name, read in list(self.live[i]):
                try:
                    out.append((i, name, read(h)))
                except (self.smi.AmdSmiException, KeyError, TypeError, ValueError) as exc:  # ValueError: "N/A"
                    self.live[i].remove((name, read))
                    self.unsupported.setdefault(i, []).append(f"{name}: {type(exc).__name__}: {exc}")
        return out


def _names(smi: Any) -> list[tuple[Any, str]]:
    out = []
    for h in smi.amdsmi_get_processor_handles():
        try:
            name = smi.amdsmi_get_gpu_asic_info(h).get("market_name") or "AMD GPU"
        except Exception:
            name = "AMD GPU"
        out.append((h, str(name)))
    return out


class AmdSmiSession:
    in_process = True

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.interval_s = float(ctx.options.get("interval_ms") or 100.0) / 1000
        self.names: dict[int, str] = {}
        self.reader: GpuReader | None = None
        self.sampler: CounterSampler | None = None
        self.smi: Any = None

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        self.smi = _import_amdsmi()
        self.smi.amdsmi_init(self.smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        gpus = _names(self.smi)
        self.names = {i: name for i, (_, name) in enumerate(gpus)}
        self.reader = GpuReader(self.smi, [(i, h) for i, (h, _) in enumerate(gpus)])
        self.sampler = CounterSampler(THREAD_NAME, self.interval_s, self.reader.read)
        self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        smi, self.smi = self.smi, None
        if smi is not None:  # once per amdsmi_init (stop and close both come here)
            try:
                smi.amdsmi_shut_down()
            except Exception:
                pass

    def collect(self, sink: Sink) -> None:
        if self.sampler is None or self.reader is None:
            return
        samples = self.sampler.take()
        devices = {i: sink.device(f"rocm:{i}", type="rocm", index=i, name=name, pid=i, label=f"GPU {i}")
                   for i, name in self.names.items()}  # fmt: skip
        for i, ts, track, value in samples:
            sink.counter(track, value, ts=ts, device=devices[i])
        self.ctx.report.detail("samples", len(samples))
        if self.reader.unsupported:
            self.ctx.report.detail("unsupported", {f"GPU {i}": v for i, v in self.reader.unsupported.items()})
        self.sampler.report(self.ctx.report)

    def close(self) -> None:
        self.stop()


class AmdSmiBackend:
    name = "amdsmi"
    api_version = API_VERSION
    activities = frozenset({"ROCM"})
    options = OptionSchema(Option("interval_ms", float, default=100.0, minimum=1, help="time between samples"))
    in_process = True

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

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> AmdSmiSession:
        return AmdSmiSession(config, ctx)


backend = AmdSmiBackend()
