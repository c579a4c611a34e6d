"""torch.profiler's arguments turned into polyprof's: activity filters (the dict form of
``activities``) and the fields of ``_ExperimentalConfig`` that change what is recorded."""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Iterable
from typing import Any

from polyprof.errors import ConfigError
from polyprof.model import ActivityKind


class UnknownActivityTypeError(ConfigError, RuntimeError):
    """An activity type name in a filter that the group does not have (RuntimeError, as torch raises)."""


#: Kineto's activity type names (what the dict form of ``activities`` lists) -> polyprof's kinds
CPU_TYPES = {
    "CPU_OP": ActivityKind.CPU_OP,
    "USER_ANNOTATION": ActivityKind.USER_ANNOTATION,
    "CPU_INSTANT_EVENT": ActivityKind.INSTANT,
    "PYTHON_FUNCTION": ActivityKind.PYTHON_FUNCTION,
}
DEVICE_TYPES = {
    "GPU_USER_ANNOTATION": ActivityKind.GPU_USER_ANNOTATION,
    "GPU_MEMCPY": ActivityKind.GPU_MEMCPY,
    "GPU_MEMSET": ActivityKind.GPU_MEMSET,
    "CONCURRENT_KERNEL": ActivityKind.KERNEL,
    "EXTERNAL_CORRELATION": None,  # a correlation mechanism, not rows: accepted, keeps nothing itself
    "OVERHEAD": ActivityKind.OVERHEAD,
    "COLLECTIVE_COMM": ActivityKind.COLLECTIVE_COMM,
    **{f"{p}_RUNTIME": ActivityKind.RUNTIME for p in ("CUDA", "XPU", "MTIA", "PRIVATEUSE1", "HPU", "GLOW")},
    **{f"{p}_DRIVER": ActivityKind.DRIVER for p in ("CUDA", "XPU", "PRIVATEUSE1")},
    **{f"{p}_SYNC": ActivityKind.SYNC for p in ("CUDA", "XPU")},
    "CUDA_EVENT": ActivityKind.SYNC,
    "MTIA_CCP_EVENTS": ActivityKind.KERNEL,
}


def group_name(activity: Any) -> str:
    name = getattr(activity, "name", activity)
    return str(name).upper()


def parse_activities(activities: Iterable[Any] | None) -> tuple[list[Any] | None, dict[str, set[int]]]:
    """(activity groups, group -> kinds kept) from torch's mixed form: each item a group or a dict
    ``{group: [activity type names]}`` (an empty list keeps nothing of that group). A group given twice
    raises ValueError; a type name the group does not have raises RuntimeError."""
    if activities is None:
        return None, {}
    if isinstance(activities, (str, bytes)):
        activities = [activities]
    groups: list[Any] = []
    seen: set[str] = set()
    filters: dict[str, set[int]] = {}

    def add(group: Any) -> str:
        name = group_name(group)
        if name in seen:
            raise ConfigError(f"Activity {group!r} specified more than once")
        seen.add(name)
        groups.append(group)
        return name

    for item in activities:
        if isinstance(item, dict):
            for group, type_names in item.items():
                filters[add(group)] = _kinds(group_name(group), type_names)
        else:
            add(item)
    return groups, filters


def _kinds(group: str, type_names: Iterable[str]) -> set[int]:
    table = CPU_TYPES if group == "CPU" else DEVICE_TYPES
    kinds: set[int] = set()
    for type_name in type_names:
        key = str(type_name).upper()
        if key not in table:
            raise UnknownActivityTypeError(
                f"Unknown or non-member activity type name: {type_name!r} for {group}; "
                f"{group} has: {', '.join(sorted(table))}"
            )
        if table[key] is not None:
            kinds.add(int(table[key]))
    return kinds


def experimental_settings(experimental_config: Any, with_stack: bool) -> tuple[Any, dict[str, Any]]:
    """(the config torch's collector gets, polyprof's ``extra`` settings) from an ``_ExperimentalConfig``.
    trace_only with with_stack is turned off with torch's warning."""
    if experimental_config is None:
        return None, {}
    if getattr(experimental_config, "trace_only", False) and with_stack:
        warnings.warn(
            "trace_only=True is incompatible with with_stack=True (stack traces require event "
            "post-processing). Disabling trace_only.",
            stacklevel=4,
        )
        experimental_config = copy.copy(experimental_config)
        experimental_config.trace_only = False
    extra: dict[str, Any] = {"torch_experimental_config": experimental_config}
    fields = experimental_fields(experimental_config)
    for field in (
        "capture_overload_names",
        "profile_all_threads",
        "record_python_gc_info",
        "expose_kineto_event_metadata",
        "trace_only",
        "verbose",
    ):
        if fields.get(field):
            extra[field] = True
    return experimental_config, extra


def experimental_fields(config: Any) -> dict[str, Any]:
    """The fields of a torch ``_ExperimentalConfig``. torch exposes only a few as attributes; all of
    them are in its pickled state, in the constructor's order (read from its signature, which varies
    between torch versions)."""
    try:
        state = config.__getstate__()
        names = re.findall(r"(\w+): [^,)]+?(?= =|,|\))", type(config).__init__.__doc__.split("\n")[0])
    except Exception:
        return {"trace_only": getattr(config, "trace_only", False)}
    names = [n for n in names if n != "self"]
    fields = dict(zip(names, state, strict=False))
    fields["trace_only"] = getattr(config, "trace_only", fields.get("trace_only", False))
    return fields
