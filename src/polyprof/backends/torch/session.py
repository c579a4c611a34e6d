"""One profile's torch session: picks the recorder, enables it when the program has imported torch (or
the moment it does), and hands its rows over at collect, and, with polyprof's observer, while recording
(``flush``: what the threads have completed, so that a spill holds the ops too)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from polyprof.backends.torch import own_profiler
from polyprof.backends.torch.collector import Collector
from polyprof.backends.torch.distributed import DistributedWatch
from polyprof.backends.torch.observed import collect_observed
from polyprof.backends.torch.versions import MIN_TORCH, torch_version
from polyprof.model import ActivityKind
from polyprof.plugin.backend import ProfileConfig, SessionContext
from polyprof.plugin.clock import ClockMapping, epoch_offset, host_ns
from polyprof.plugin.sink import Sink
from polyprof.plugin.traits import SessionTraits
from polyprof.torch import bridge, observer
from polyprof.torch.import_hook import PostImportHook


def observer_options(config: ProfileConfig) -> int:
    """The observer's start() flags for `config`."""
    flags = (
        (config.record_shapes, observer.RECORD_SHAPES),
        (config.profile_memory, observer.PROFILE_MEMORY),
        (config.with_flops, observer.WITH_FLOPS),
        (config.with_modules, observer.WITH_MODULES),
        (bool(config.extra.get("profile_all_threads")), observer.ALL_THREADS),
        (bool(config.extra.get("capture_overload_names")), observer.OVERLOAD_NAMES),
        (config.extra.get("torch_ops") == "top", observer.TOP_LEVEL_ONLY),
    )  # (with_stack: the python backend records the calls, as torch's Python tracer does)
    return sum(flag for on, flag in flags if on)


class TorchSession:
    traits = SessionTraits(thread_affine=True)  # torch's profiler must be stopped on the thread that started it

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.config = config
        self.ctx = ctx
        self.torch: Any = None
        self.enabled = False
        self.recording = False
        self.hook: PostImportHook | None = None
        self.pairs: list[tuple[int, int]] = []
        self.uncertainty_ns = 0
        self.enabled_tid = 0
        self.observer: observer.Observer | None = None
        self.collector: Collector | None = None
        self.observed = -1  # ops recorded by the observer, once stopped
        self.stop_ns = 0
        self.torch_flag_before = False  # torch.autograd.profiler._is_profiler_enabled at start
        self.distributed = DistributedWatch()
        self.flushed = False  # rows were handed over while recording: fwd->bwd links span hand-overs
        self.carry: dict[tuple[int, int], tuple[int, int]] = {}  # forward ops waiting for their backward node
        self.reading = threading.Lock()  # one read-out of the observer at a time: a flush's, or stop's

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        pass

    def start(self) -> None:
        if self.config.extra.get("torch_ops") == "none":  # a flight recorder's choice: no operators at all
            self.ctx.report.detail("recorder", "none (torch_ops='none')")
            return
        self.recording = True
        self._pair()
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "_C"):
            self._enable(torch)
        else:
            self.hook = PostImportHook("torch", self._on_torch_imported)
            self.hook.install()

    def _on_torch_imported(self, torch: Any) -> None:
        if self.recording and not self.enabled:
            try:
                self._enable(torch)
            except Exception as exc:  # never break the program's `import torch`
                self.ctx.report.error(f"enabling torch's profiler after `import torch` failed: {exc}")

    def _enable(self, torch: Any) -> None:
        self.distributed.install()
        if torch_version(torch) < MIN_TORCH:
            self.ctx.report.error(
                f"torch {torch.__version__} is older than the supported 2.4; no aten ops recorded"
            )
            return
        self.torch = torch
        self.enabled_tid = threading.get_native_id()
        self._announce(torch, True)
        obs, why_not = self._observer(torch)
        if obs is not None:
            bridge.install(obs)
        if obs is not None and not why_not:
            obs.start(observer_options(self.config))
            self.observer = obs
            own_profiler.recording(self, torch)
            self.enabled = True
            self.ctx.report.detail("recorder", "polyprof observer")
            self.ctx.report.detail("hand-over barrier", obs.barrier())
            return
        self.ctx.report.detail("recorder", f"torch collector ({why_not})")
        self.collector = Collector(self.config, self.ctx)
        self.collector.start()
        own_profiler.recording(self, torch)
        if obs is not None:
            obs.note_collector_state(True)  # polyprof's own annotations do not route through it
        self.enabled = True

    def _announce(self, torch: Any, recording: bool) -> None:
        """Set torch's Python-side "a profiler is on" flag as torch.profiler does: torch.compile'd code
        checks it to emit its own ranges (compiled graphs, Triton kernel launches). The value found at
        start is restored at stop, in case torch.profiler itself runs around this profile."""
        profiler = getattr(getattr(torch, "autograd", None), "profiler", None)
        if profiler is None or not isinstance(getattr(profiler, "_is_profiler_enabled", None), bool):
            return
        if recording:
            self.torch_flag_before = profiler._is_profiler_enabled
            profiler._is_profiler_enabled = True
        else:
            profiler._is_profiler_enabled = self.torch_flag_before

    def _observer(self, torch: Any) -> tuple[observer.Observer | None, str]:
        """(polyprof's observer, "") when it serves the options and loads; (it or None, why not) when
        torch's collector records the ops. The library is returned whenever it loads, for the bridge."""
        if observer.disabled():
            return None, "POLYPROF_TORCH_OBSERVER=0"
        try:
            obs = observer.get(torch)
        except observer.BuildError as exc:
            self.ctx.report.warning(
                f"polyprof's torch operator observer is unavailable, so torch's own collector records "
                f"the ops (same ops, slower stop): {exc}. POLYPROF_TORCH_OBSERVER=0 silences this."
            )
            return None, "the observer could not be built"
        if self.config.with_stack and self.config.profile_memory:
            return obs, "with_stack with profile_memory: torch's memory timeline walks torch's own event tree"
        return obs, ""

    def stop(self) -> None:
        self.recording = False
        self.distributed.remove()
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if not self.enabled:
            return
        self.enabled = False
        own_profiler.not_recording(self)
        self._announce(self.torch, False)
        if threading.get_native_id() != self.enabled_tid and not self.config.extra.get("profile_all_threads"):
            self.ctx.report.error(
                "torch's profiler was stopped from another thread than the one that started it; "
                "stop the profile on the thread that started it to get aten ops"
            )
        if self.observer is not None:
            with self.reading:  # a flush in progress reads its hand-over to the end first
                self.observed = self.observer.stop()
            self.stop_ns = self.ctx.window_end or host_ns()
            return
        if self.collector is not None:
            try:
                self.collector.stop()
            finally:
                obs = observer.cached(self.torch)
                if obs is not None:
                    obs.note_collector_state(False)
            self._pair()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.collector = None
            if self.observer is not None:
                self.observer.reset()
                self.observer = None

    def _pair(self) -> None:
        off = epoch_offset()
        now = host_ns()
        self.pairs.append((now + off.offset_ns, now))
        self.uncertainty_ns = max(self.uncertainty_ns, off.uncertainty_ns)

    # -- collect ----------------------------------------------------------------------------------
    def flush(self, sink: Sink) -> None:
        """While recording: the operators the threads have completed (polyprof's observer only; torch's
        collector gives its events at stop)."""
        self.distributed.note()
        with self.reading:
            obs = self.observer
            if obs is None or not self.enabled:
                return
            n = obs.take()
            try:
                if n or self.config.profile_memory:
                    self.flushed = True
                    collect_observed(obs, n, sink, self.config, self.ctx, 0, self.carry, self.distributed.info)
            finally:
                obs.release()

    def unfinished_now(self, sink: Sink, end_ns: int) -> None:
        """While recording: the operators open now on every thread, up to `end_ns` with ``"finished":
        false`` (a dump's view of the op a hang is stuck in: a collective, a wait)."""
        with self.reading:
            obs = self.observer
            if obs is None or not self.enabled:
                return
            host = sink.host_device()
            for tid, start, name in obs.open_ops():
                if start <= end_ns:
                    sink.activity(ActivityKind.CPU_OP, name, device=host, resource=sink.host_thread(tid), start=start,
                                  end=end_ns, args={"finished": False})

    def collect(self, sink: Sink) -> None:
        self.distributed.note()
        clock = self.distributed.clock_summary()
        if clock is not None:
            self.ctx.report.clock_offset("to rank 0", clock)
        info = self.distributed.info
        if info is not None:
            sink.add_metadata("distributedInfo", info)
        if self.observer is not None and self.observed >= 0:
            n, self.observed = self.observed, -1
            try:
                carry = self.carry if self.flushed else None
                collect_observed(self.observer, n, sink, self.config, self.ctx, self.stop_ns, carry, info)
                self.carry = {}
            finally:
                self.observer.reset()
            return
        if self.collector is not None:
            mapping = ClockMapping.fit(
                [e for e, _ in self.pairs], [h for _, h in self.pairs], uncertainty_ns=self.uncertainty_ns
            )
            self.ctx.report.clock_mapping(mapping, "torch (epoch ns)")
            self.collector.collect(sink, mapping)
