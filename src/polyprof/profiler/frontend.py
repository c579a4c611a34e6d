"""``polyprof.profiler.profile``: torch.profiler.profile's signature and behaviour over polyprof's engine.

Every argument of torch.profiler.profile is accepted and does what torch's does: the dict form of
``activities`` filters activity types; ``experimental_config`` fields change what is recorded
(``capture_overload_names``, ``profile_all_threads``, ``record_python_gc_info``,
``expose_kineto_event_metadata``, ``trace_only``, ``verbose``); ``execution_trace_observer`` (or
``ENABLE_PYTORCH_EXECUTION_TRACE=1``) runs in the recording windows; ``acc_events`` keeps events across
cycles; ``post_processing_timeout_s`` bounds building ``events()``. With torch imported, ``prof.profiler``
is a ``torch.autograd.profiler.profile`` over polyprof's trace (see :mod:`.torch_view`), so
``events()``, ``key_averages()``, ``table()``, ``export_stacks()``, ``_stats()`` are torch's own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
import uuid
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from polyprof.engine.profile_options import ProfileOptions
from polyprof.engine.scheduled import Profile
from polyprof.errors import ConfigError
from polyprof.profiler.options import experimental_settings, parse_activities
from polyprof.profiler.settings import activity_edits
from polyprof.torch.steps import profiler_stepped

TORCH_ONLY_OPTIONS = ("record_shapes", "profile_memory", "with_flops", "with_stack")
PROFILER_STEP_NAME = "ProfilerStep"


def _with_python_frames(groups: list[Any] | None, registry: Any) -> list[Any] | None:
    """with_stack records the Python frames too, as torch.profiler's does: the python backend's group
    joins the ones asked for (all those available when none were named), where it is available."""
    from polyprof.engine.registry import default
    from polyprof.engine.selection import activity_group_name, select_backends

    registry = registry or default
    entry = next((e for e in registry.entries() if e.name == "python" and not e.broken), None)
    if entry is None or not registry.probe(entry).available:
        return groups  # the ops' stacks still come from the observer
    if groups is None:
        groups = list(select_backends(registry, None).groups)
    if "PYTHON" not in {activity_group_name(g) for g in groups}:
        groups = [*groups, "PYTHON"]
    return groups


def torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _check_timeout(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"post_processing_timeout_s must be a number of seconds or None, got {value!r}")
    if value < 0:
        raise ConfigError(f"post_processing_timeout_s must be non-negative, got {value!r}")
    return float(value)


def _execution_trace_from_env() -> Any:
    """torch's ExecutionTraceObserver when ENABLE_PYTORCH_EXECUTION_TRACE=1 asks for one, as torch does."""
    if os.environ.get("ENABLE_PYTORCH_EXECUTION_TRACE", "0") in ("", "0") or not torch_installed():
        return None
    from torch.profiler import ExecutionTraceObserver

    return ExecutionTraceObserver.build_execution_trace_obs_from_env()


def _step_tracker() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        from torch.autograd.profiler import KinetoStepTracker
    except ImportError:
        return None
    return KinetoStepTracker


def add_event_indices(trace: Any) -> None:
    """Kineto's "Ev Idx" arg (an event's index among the host events), which torch.profiler exposes
    with expose_kineto_event_metadata."""
    import numpy as np

    from polyprof.model import ActivityKind, ArgColumns

    kinds = [int(k) for k in (ActivityKind.CPU_OP, ActivityKind.USER_ANNOTATION, ActivityKind.INSTANT,
                              ActivityKind.PYTHON_FUNCTION)]
    rows = np.flatnonzero(np.isin(trace.activities["kind"], kinds))
    trace.activities.args.add_block(rows, ArgColumns(("Ev Idx",), (np.arange(len(rows), dtype=np.int64),)))


@dataclasses.dataclass(frozen=True)
class _RecordFlags:
    """torch.profiler's switches of what to record about operators, as given."""

    record_shapes: Any
    profile_memory: Any
    with_stack: Any
    with_flops: Any
    with_modules: Any

    @property
    def shapes(self) -> Any:
        """Shapes are recorded when asked for, and for the flops, which are counted from them."""
        return self.record_shapes or self.with_flops

    def check_torch(self) -> None:
        """Each switch describes PyTorch operators: without torch installed, one asked for is an error."""
        asked = [name for name in (*TORCH_ONLY_OPTIONS, "with_modules") if getattr(self, name)]
        if asked and not torch_installed():
            raise ConfigError(
                f"{', '.join(asked)} describe PyTorch operators and need torch, which is not installed: "
                "pip install torch, or leave these options off to profile annotations and devices"
            )

    def metadata(self) -> dict[str, int]:
        """The trace's metadata of the switches on (1 each), as torch.profiler writes them."""
        on = (("profile_memory", self.profile_memory), ("with_stack", self.with_stack),
              ("record_shapes", self.shapes), ("with_modules", self.with_modules), ("with_flops", self.with_flops))
        return {name: 1 for name, value in on if value}


class profile(Profile):  # noqa: N801 - torch's name
    """Same keyword arguments as ``torch.profiler.profile`` (see the module docstring), plus polyprof's
    own (``backend_options``, ``call_timeout_s``, ``metadata``...)."""

    _lenient_settings = False  # a broken POLYPROF_ACTIVITIES or configuration file raises ConfigError here

    def __init__(
        self,
        *,
        activities: Iterable[Any] | None = None,
        schedule: Callable[[int], Any] | None = None,
        on_trace_ready: Callable[[Any], Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: Any = None,
        execution_trace_observer: Any = None,
        acc_events: bool = False,
        use_cuda: bool | None = None,
        custom_trace_id_callback: Callable[[], str] | None = None,
        post_processing_timeout_s: float | None = None,
        **polyprof_options: Any,
    ) -> None:
        self.post_processing_timeout_s = _check_timeout(post_processing_timeout_s)
        own = ProfileOptions.of(polyprof_options.pop("options", None), polyprof_options)
        # torch's keywords that ProfileOptions also has: the one given here wins, else the options object's
        flags = _RecordFlags(record_shapes or own.record_shapes, profile_memory or own.profile_memory,
                             with_stack or own.with_stack, with_flops or own.with_flops,
                             with_modules or own.with_modules)
        flags.check_torch()
        groups, filters = parse_activities(activities)
        groups = activity_edits(self._lenient_settings).apply(groups, own.registry)  # POLYPROF_ACTIVITIES, config file
        if use_cuda is not None:
            warnings.warn(
                "`use_cuda` is deprecated, use `activities` argument instead", FutureWarning, stacklevel=2
            )
            if use_cuda:
                groups = [*(groups or ["CPU"]), "CUDA"]
        if flags.with_stack and not flags.profile_memory:  # (with profile_memory, torch's collector records the frames)
            groups = _with_python_frames(groups, own.registry)
        experimental_config, extra = experimental_settings(experimental_config, flags.with_stack)
        self.experimental_config = experimental_config
        self.record_shapes = flags.shapes
        self.profile_memory, self.with_stack, self.with_flops = flags.profile_memory, flags.with_stack, flags.with_flops
        self.with_modules = flags.with_modules
        self.acc_events = acc_events
        self.custom_trace_id_callback = custom_trace_id_callback
        self.execution_trace_observer = execution_trace_observer or _execution_trace_from_env()
        self.preset_metadata: dict[str, Any] = {}
        self._trace_id = ""
        self._view: Any = None
        self._before_first_trace: Any = None
        options = dataclasses.replace(
            own,
            schedule=schedule or own.schedule,
            on_trace_ready=on_trace_ready or own.on_trace_ready,
            record_shapes=flags.shapes,
            profile_memory=flags.profile_memory,
            with_stack=flags.with_stack,
            with_flops=flags.with_flops,
            with_modules=flags.with_modules,
            activity_filters=filters or own.activity_filters,
            window_observers=(*own.window_observers, *filter(None, [self.execution_trace_observer])),
            extra={**own.extra, **extra},
            metadata={**flags.metadata(), **own.metadata},
        )
        super().__init__(groups, options=options)
        tracker = _step_tracker()
        if tracker is not None:
            tracker.init_step_count(PROFILER_STEP_NAME)

    # -- the cycle -------------------------------------------------------------------------------------
    def _start_recording(self) -> None:
        self._trace_id = (
            self.custom_trace_id_callback() if self.custom_trace_id_callback else f"{uuid.uuid4().int:032X}"
        )
        self._metadata["trace_id"] = self._trace_id
        self._metadata.update(self.preset_metadata)
        super()._start_recording()

    def _on_trace(self, trace: Any) -> None:
        """Each cycle's trace, on the writer before on_trace_ready."""
        if self.config.extra.get("expose_kineto_event_metadata"):
            add_event_indices(trace)
        if self.with_stack and self.config.extra.get("verbose"):
            from polyprof.profiler.torch_view import add_call_stacks

            add_call_stacks(trace)
        # the torch view is built when asked for (prof.profiler), except that acc_events needs each
        # cycle's events processed before the next cycle replaces the trace, as torch does
        self._view = self._torch_view(self._view, trace) if self.acc_events else None

    def _between_steps(self) -> None:
        super()._between_steps()
        profiler_stepped()  # a step boundary for on-demand captures (polyprof.torch.steps)

    def step(self) -> None:
        super().step()
        tracker = _step_tracker()
        if tracker is not None and os.environ.get("KINETO_USE_DAEMON", ""):
            tracker.increment_step(PROFILER_STEP_NAME)

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            tracker = _step_tracker()
            if tracker is not None:
                tracker.erase_step_count(PROFILER_STEP_NAME)
            cleanup = getattr(self.execution_trace_observer, "cleanup", None)
            if callable(cleanup):
                cleanup()

    def _torch_view(self, previous: Any, trace: Any) -> Any:
        if "torch" not in sys.modules or trace is None:
            return None
        from polyprof.profiler.torch_view import autograd_view

        return autograd_view(
            trace,
            use_device=self._device_type(trace),
            previous=previous,
            record_shapes=self.record_shapes,
            with_flops=self.with_flops,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_modules=self.with_modules,
            experimental_config=self.experimental_config,
            acc_events=self.acc_events,
            post_processing_timeout_s=self.post_processing_timeout_s,
        )

    @staticmethod
    def _device_type(trace: Any) -> str | None:
        """The device whose time the tables show (torch's use_device): the first device that ran work."""
        types = [d.type for d in trace.devices if d.type not in ("cpu", "unknown")]
        return types[0] if types else None

    # -- torch.profiler's analysis API ------------------------------------------------------------
    @property
    def profiler(self) -> Any:
        """The last cycle as a ``torch.autograd.profiler.profile`` (without torch: None):
        ``function_events``, ``kineto_results``, ``key_averages()``, ``table()``... As torch's
        attribute, it is None until the schedule first leaves its wait steps, and an object from then
        on (vLLM and others test it): before the first trace exists, one with no events yet."""
        self._wait_for_trace()
        if self._view is None and self._trace is not None:
            self._view = self._torch_view(None, self._trace)
        if self._view is None and self._window is not None and "torch" in sys.modules:
            if self._before_first_trace is None:
                from torch.autograd.profiler import profile as autograd_profile

                self._before_first_trace = autograd_profile(use_kineto=True, use_cpu=True)
            return self._before_first_trace
        return self._view

    @profiler.setter
    def profiler(self, value: Any) -> None:  # torch's own code assigns it; a framework may too
        self._view = value

    def key_averages(
        self,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
    ) -> Any:
        """Per-operator averages of the last trace, with ``.table(sort_by=..., row_limit=...)``.

        With torch imported this is torch's own EventList (so the table is torch's); sort keys such as
        ``self_cuda_time_total`` mean device time, whichever device ran the work.
        """
        view = self.profiler
        if view is not None:
            return view.key_averages(group_by_input_shape, group_by_stack_n, group_by_overload_name)
        from polyprof.profiler.averages import native_key_averages

        return native_key_averages(self.trace, group_by_input_shape, group_by_stack_n)

    def events(self) -> Any:
        """The unaggregated events of the last trace: torch's FunctionEvents when torch is imported,
        else :class:`polyprof.profiler.averages.HostEvent` objects."""
        if self.config.extra.get("trace_only"):
            raise RuntimeError(
                "events() is not available when trace_only=True in ExperimentalConfig. "
                "Use export_chrome_trace() instead."
            )
        view = self.profiler
        if view is not None:
            return view.function_events
        from polyprof.profiler.averages import host_events

        return host_events(self.trace)[0]

    def _stats(self) -> Any:
        """torch's profiler stats of the last cycle (prepare/enable/disable/parse/tree-build times)."""
        view = self.profiler
        return None if view is None else view._stats

    def export_chrome_trace(self, path: str, use_python_export: bool = False) -> str:
        """Write the last trace as Kineto-dialect Chrome JSON (gzip when `path` ends in .gz; Perfetto
        protobuf when it ends in .pftrace or .perfetto-trace). `use_python_export` is accepted for torch compatibility: polyprof always streams its writer."""
        return super().export_chrome_trace(path)

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total") -> Any:
        """Collapsed stacks for flamegraph.pl or speedscope (needs with_stack=True), as torch writes them."""
        view = self.profiler
        if view is None:
            raise ConfigError("export_stacks needs torch imported and a trace recorded with with_stack=True")
        return view.export_stacks(path, metric)

    def export_memory_timeline(self, path: str, device: str | None = None) -> None:
        """torch's memory timeline (.html, .json, .json.gz, .raw.json.gz); needs record_shapes,
        profile_memory and with_stack, as torch's does."""
        missing = [
            f"{n}=True" for n in ("record_shapes", "profile_memory", "with_stack") if not getattr(self, n)
        ]
        if missing:
            raise ValueError(f"{', '.join(missing)} required for memory profiling.")
        import gzip
        import tempfile

        from torch.profiler._memory_profiler import MemoryProfile, MemoryProfileTimeline

        device = device or "cpu"
        timeline = MemoryProfileTimeline(MemoryProfile(self.profiler.kineto_results))
        if path.endswith(".html"):
            timeline.export_memory_timeline_html(path, device)
        elif path.endswith(".gz"):
            with tempfile.NamedTemporaryFile("w+t", suffix=".json") as fp:
                if path.endswith("raw.json.gz"):
                    timeline.export_memory_timeline_raw(fp.name, device)
                else:
                    timeline.export_memory_timeline(fp.name, device)
                with open(fp.name) as fin, gzip.open(path, "wt") as fout:
                    fout.writelines(fin)
        else:
            timeline.export_memory_timeline(path, device)

    def get_trace_id(self) -> str | None:
        """The id of the current (or last) cycle's trace (``custom_trace_id_callback``'s or a UUID)."""
        return self._trace_id or None

    def set_custom_trace_id_callback(self, callback: Callable[[], str]) -> None:
        self.custom_trace_id_callback = callback

    def preset_metadata_json(self, key: str, value: str) -> None:
        """Metadata (JSON text) added to every trace this profile records from its next start."""
        import orjson

        try:
            self.preset_metadata[str(key)] = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"preset_metadata_json({key!r}): value is not valid JSON: {exc}") from exc
