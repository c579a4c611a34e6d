"""``polyprof.profiler``: the torch.profiler-shaped front end.

::

    from polyprof.profiler import ProfilerActivity, profile, record_function, schedule

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.OPENCL]) as prof:
        with record_function("my block"):
            ...
    prof.export_chrome_trace("trace.json")

``ProfilerActivity`` has the members torch has (CPU, CUDA, XPU, ...) and gains one for every activity
group an installed backend serves (OPENCL once polyprof-opencl is installed). Unlike torch, several
devices can be profiled in one session.
"""

from __future__ import annotations

from polyprof.annotations import record_function
from polyprof.engine import ProfilerAction, schedule
from polyprof.profiler.activity import ProfilerActivity, supported_activities
from polyprof.profiler.frontend import profile
from polyprof.profiler.handlers import tensorboard_trace_handler

__all__ = [
    "ProfilerAction",
    "ProfilerActivity",
    "profile",
    "record_function",
    "schedule",
    "supported_activities",
    "tensorboard_trace_handler",
]
