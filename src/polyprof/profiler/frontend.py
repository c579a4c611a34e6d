"""``polyprof.profiler.profile``: torch.profiler.profile's signature over polyprof's engine."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from polyprof.engine import Profile
from polyprof.errors import ConfigError

TORCH_ONLY_OPTIONS = ("record_shapes", "profile_memory", "with_flops", "with_stack")
_warned_unsupported: set[str] = set()  # each unsupported argument is warned about once per process


def _torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


class profile(Profile):  # noqa: N801 - torch's name
    """Same keyword arguments as ``torch.profiler.profile``. Arguments polyprof does not implement yet
    are accepted with one warning naming them (never silently ignored)."""

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
        custom_trace_id_callback: Callable[[], str] | None = None,
        post_processing_timeout_s: float | None = None,
        **polyprof_options: Any,
    ) -> None:
        unsupported = [
            name
            for name, value, default in (
                ("with_modules", with_modules, False),
                ("experimental_config", experimental_config, None),
                ("execution_trace_observer", execution_trace_observer, None),
                ("acc_events", acc_events, False),
                ("custom_trace_id_callback", custom_trace_id_callback, None),
                ("post_processing_timeout_s", post_processing_timeout_s, None),
            )
            if value != default
        ]
        asked = [
            n
            for n, v in zip(
                TORCH_ONLY_OPTIONS, (record_shapes, profile_memory, with_flops, with_stack), strict=True
            )
            if v
        ]
        if asked and not _torch_installed():
            raise ConfigError(
                f"{', '.join(asked)} describe PyTorch operators and need torch, which is not installed: "
                "pip install torch, or leave these options off to profile annotations and devices"
            )
        unsupported = [name for name in unsupported if name not in _warned_unsupported]
        if unsupported:
            _warned_unsupported.update(unsupported)
            warnings.warn(
                f"polyprof.profiler.profile does not implement {', '.join(unsupported)} yet; "
                "they are ignored (this warning is given once)",
                stacklevel=2,
            )
        super().__init__(
            activities,
            schedule=schedule,
            on_trace_ready=on_trace_ready,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            **polyprof_options,
        )

    # -- torch.profiler's analysis API ------------------------------------------------------------
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
        from polyprof.profiler.averages import key_averages

        return key_averages(self.trace, group_by_input_shape, group_by_stack_n, group_by_overload_name)

    def events(self) -> Any:
        """The host ops and annotations of the last trace, unaggregated (torch's EventList when torch
        is imported, else a list of :class:`polyprof.profiler.averages.HostEvent`)."""
        import sys

        from polyprof.profiler.averages import host_events, torch_function_events

        if "torch" in sys.modules:
            return torch_function_events(self.trace)
        return host_events(self.trace)[0]
