"""polyprof: an activity profiler whose device backends are plugins found at run time.

::

    import polyprof

    with polyprof.profile(activities=["cpu"]) as prof:
        with polyprof.record_function("work"):
            ...
    prof.export_chrome_trace("trace.json")

``polyprof.profiler`` is the torch.profiler-compatible front end; ``polyprof.register_backend``
adds a backend from inside a program; ``polyprof backends`` (CLI) lists what is installed.
"""

from polyprof._version import __version__
from polyprof.annotations import counter, instant, record_function
from polyprof.backend import API_VERSION, Availability

# polyprof's record_function is also a torch range whenever a torch-side consumer listens (see
# polyprof.backends.torch.bridge); arming it costs nothing until torch is imported
from polyprof.backends.torch.bridge import arm as _arm_torch_bridge
from polyprof.engine import PolyprofWarning, Profile, ProfilerAction, profile, schedule
from polyprof.errors import (
    BackendConflictError,
    BackendUnavailableError,
    ConfigError,
    PolyprofError,
    TraceFormatError,
    UnknownNameError,
)
from polyprof.registry import register_backend

_arm_torch_bridge()

__all__ = [
    "API_VERSION",
    "Availability",
    "BackendConflictError",
    "BackendUnavailableError",
    "ConfigError",
    "PolyprofError",
    "PolyprofWarning",
    "Profile",
    "ProfilerAction",
    "TraceFormatError",
    "UnknownNameError",
    "__version__",
    "counter",
    "instant",
    "profile",
    "record_function",
    "register_backend",
    "schedule",
]
