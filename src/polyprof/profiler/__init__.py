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

Where torch is installed, ``profile`` is a subclass of ``torch.profiler.profile`` whose lifecycle is
torch's own code (:mod:`polyprof.profiler.torch_profile`), ``ProfilerAction`` is torch's and
``schedule`` returns torch's actions (looking any of them up imports torch); without torch, they are
polyprof's own, with the same arguments and values (:mod:`polyprof.profiler.frontend`,
:mod:`polyprof.engine.schedule`).
``polyprof.install_torch_profiler()`` puts it behind ``torch.profiler`` itself
(:mod:`polyprof.profiler.behind_torch`).

torch.profiler's other names are here too, so that ``from torch.profiler import X`` becomes
``from polyprof.profiler import X`` for every X: ``kineto_available`` (polyprof always is),
``supported_activities``, ``tensorboard_trace_handler``, ``ProfilerAction``, and, loaded from torch
when first used (they need torch installed), ``DeviceType``, ``ExecutionTraceObserver``,
``_ExperimentalConfig``, ``RecordScope``, ``KinetoStepTracker``, ``itt``, ``_utils``,
``_memory_profiler``, ``_pattern_matcher``.
"""

from __future__ import annotations

import importlib
from typing import Any

from polyprof.annotations import record_function
from polyprof.profiler.activity import ProfilerActivity, supported_activities
from polyprof.profiler.handlers import tensorboard_trace_handler

__all__ = [
    "DeviceType",
    "ExecutionTraceObserver",
    "ProfilerAction",
    "ProfilerActivity",
    "kineto_available",
    "profile",
    "record_function",
    "schedule",
    "supported_activities",
    "tensorboard_trace_handler",
]

#: names taken from torch when first asked for: name -> (module, attribute or None for the module)
_FROM_TORCH = {
    "DeviceType": ("torch.autograd", "DeviceType"),
    "ExecutionTraceObserver": ("torch.profiler", "ExecutionTraceObserver"),
    "_ExperimentalConfig": ("torch._C._profiler", "_ExperimentalConfig"),
    "RecordScope": ("torch.autograd.profiler", "RecordScope"),
    "KinetoStepTracker": ("torch.autograd.profiler", "KinetoStepTracker"),
    "_KinetoProfile": ("torch.profiler.profiler", "_KinetoProfile"),
    "itt": ("torch.profiler.itt", None),
    "_utils": ("torch.profiler._utils", None),
    "_memory_profiler": ("torch.profiler._memory_profiler", None),
    "_pattern_matcher": ("torch.profiler._pattern_matcher", None),
    "python_tracer": ("torch.profiler.python_tracer", None),
}


def kineto_available() -> bool:
    """torch.profiler.kineto_available's twin: polyprof's Kineto-dialect profiler is always available."""
    return True


def _torch_shaped(name: str) -> Any:
    """profile, schedule, ProfilerAction: torch's types where torch is installed (see above)."""
    from polyprof.engine import schedule as engine
    from polyprof.profiler.frontend import profile as native
    from polyprof.profiler.frontend import torch_installed

    if not torch_installed():
        return {"profile": native, "schedule": engine.schedule, "ProfilerAction": engine.ProfilerAction}[name]
    from polyprof.profiler import torch_profile
    from polyprof.profiler.torch_originals import original

    if name == "profile":
        return torch_profile.torch_backed(native, original("profile"))
    if name == "schedule":
        return torch_profile.torch_schedule(engine.schedule)
    import torch.profiler

    return torch.profiler.ProfilerAction


def __getattr__(name: str) -> Any:
    if name in ("profile", "schedule", "ProfilerAction"):
        value = globals()[name] = _torch_shaped(name)
        return value
    where = _FROM_TORCH.get(name)
    if where is None:
        raise AttributeError(f"module 'polyprof.profiler' has no attribute {name!r}")
    module, attribute = where
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise AttributeError(
            f"polyprof.profiler.{name} is torch.profiler's and needs torch (pip install torch): {exc}"
        ) from exc
    value = mod if attribute is None else getattr(mod, attribute)
    globals()[name] = value
    return value
