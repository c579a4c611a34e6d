"""``polyprof.profiler.profile``: torch.profiler.profile's signature over polyprof's engine."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from polyprof.engine import Profile


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
        if unsupported:
            warnings.warn(
                f"polyprof.profiler.profile does not implement {', '.join(unsupported)} yet; "
                "they are ignored for this profile",
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
