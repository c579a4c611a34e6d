"""Semantic kinds of activity and the Kineto category (`cat`) each is written with by default."""

from __future__ import annotations

from enum import IntEnum


class ActivityKind(IntEnum):
    """What an activity is, independent of which device or backend produced it."""

    CPU_OP = 0
    USER_ANNOTATION = 1
    GPU_USER_ANNOTATION = 2
    KERNEL = 3
    GPU_MEMCPY = 4
    GPU_MEMSET = 5
    RUNTIME = 6
    DRIVER = 7
    SYNC = 8
    PYTHON_FUNCTION = 9
    INSTANT = 10
    OVERHEAD = 11
    COLLECTIVE_COMM = 12

    @classmethod
    def parse(cls, value: ActivityKind | str | int) -> ActivityKind:
        if isinstance(value, ActivityKind):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                from polyprof.errors import UnknownNameError

                raise UnknownNameError("activity kind", value, [k.name.lower() for k in cls]) from None
        return cls(value)


#: Kineto's `cat` names. Runtime, driver and sync have per-device names in Kineto
#: (`cuda_runtime`, `xpu_runtime`, ...): backends pass their own `cat` for those.
DEFAULT_CATEGORY: dict[ActivityKind, str] = {
    ActivityKind.CPU_OP: "cpu_op",
    ActivityKind.USER_ANNOTATION: "user_annotation",
    ActivityKind.GPU_USER_ANNOTATION: "gpu_user_annotation",
    ActivityKind.KERNEL: "kernel",
    ActivityKind.GPU_MEMCPY: "gpu_memcpy",
    ActivityKind.GPU_MEMSET: "gpu_memset",
    ActivityKind.RUNTIME: "runtime",
    ActivityKind.DRIVER: "driver",
    ActivityKind.SYNC: "sync",
    ActivityKind.PYTHON_FUNCTION: "python_function",
    ActivityKind.INSTANT: "cpu_instant_event",
    ActivityKind.OVERHEAD: "overhead",
    ActivityKind.COLLECTIVE_COMM: "collective_comm",
}

#: Kinds that run on a device rather than on a host thread.
DEVICE_KINDS = frozenset(
    {
        ActivityKind.KERNEL,
        ActivityKind.GPU_MEMCPY,
        ActivityKind.GPU_MEMSET,
        ActivityKind.GPU_USER_ANNOTATION,
        ActivityKind.COLLECTIVE_COMM,
    }
)

#: Best guess of a kind from a Kineto `cat`, used when reading traces back.
CATEGORY_TO_KIND: dict[str, ActivityKind] = {
    "cpu_op": ActivityKind.CPU_OP,
    "user_annotation": ActivityKind.USER_ANNOTATION,
    "gpu_user_annotation": ActivityKind.GPU_USER_ANNOTATION,
    "kernel": ActivityKind.KERNEL,
    "gpu_memcpy": ActivityKind.GPU_MEMCPY,
    "gpu_memset": ActivityKind.GPU_MEMSET,
    "python_function": ActivityKind.PYTHON_FUNCTION,
    "cpu_instant_event": ActivityKind.INSTANT,
    "overhead": ActivityKind.OVERHEAD,
    "collective_comm": ActivityKind.COLLECTIVE_COMM,
    # Kineto's older names (torch < 1.10 traces) and its MTIA / range-profiler categories
    "memcpy": ActivityKind.GPU_MEMCPY,
    "memset": ActivityKind.GPU_MEMSET,
    "runtime": ActivityKind.RUNTIME,
    "driver": ActivityKind.DRIVER,
    "mtia_ccp_events": ActivityKind.KERNEL,
    "mtia_runtime": ActivityKind.RUNTIME,
    # the CUPTI range profiler's ranges: Kineto splits its window evenly among them; no device time
    "cuda_profiler_range": ActivityKind.GPU_USER_ANNOTATION,
    "concurrent_kernel": ActivityKind.KERNEL,
}


def kind_from_category(cat: str) -> ActivityKind:
    """`cuda_runtime` -> RUNTIME, `xpu_driver` -> DRIVER, `kernel` -> KERNEL, unknown -> CPU_OP."""
    kind = CATEGORY_TO_KIND.get(cat.lower())
    if kind is not None:
        return kind
    for suffix, k in (
        ("_runtime", ActivityKind.RUNTIME),
        ("_driver", ActivityKind.DRIVER),
        ("_sync", ActivityKind.SYNC),
    ):
        if cat.endswith(suffix):
            return k
    return ActivityKind.CPU_OP
