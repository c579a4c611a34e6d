"""polyprof: an activity profiler whose device backends are plugins found at run time.

::

    import polyprof

    with polyprof.profile(activities=["cpu"]) as prof:
        with polyprof.record_function("work"):
            ...
    prof.export_chrome_trace("trace.json")

``polyprof.profiler`` is the torch.profiler-compatible front end, and ``polyprof.install_torch_profiler()``
puts it behind ``torch.profiler`` itself (for frameworks that make their own); ``polyprof.register_backend``
adds a backend from inside a program; ``polyprof.plugin`` is what backend authors import;
``polyprof backends`` (CLI) lists what is installed.

The names below load when first used (PEP 562): a library that only annotates (``record_function``,
``instant``, ``counter``) imports neither numpy nor the engine.
"""

from __future__ import annotations

from polyprof._lazy import lazy_names
from polyprof._version import __version__
from polyprof.annotations import counter, instant, record_function

# polyprof's record_function is also a torch range whenever a torch-side consumer listens (see
# polyprof.torch.bridge); arming it costs nothing until torch is imported
from polyprof.torch.bridge import arm as _arm_torch_bridge

_arm_torch_bridge()

#: public name -> the module that owns it
_LAZY = {
    "API_VERSION": "polyprof.plugin.backend",
    "Availability": "polyprof.plugin.backend",
    "BackendConflictError": "polyprof.errors",
    "BackendContractError": "polyprof.errors",
    "BackendUnavailableError": "polyprof.errors",
    "ConfigError": "polyprof.errors",
    "OutputPathError": "polyprof.errors",
    "PolyprofError": "polyprof.errors",
    "PolyprofWarning": "polyprof.errors",
    "SinkClosedError": "polyprof.errors",
    "TraceFormatError": "polyprof.errors",
    "UnknownNameError": "polyprof.errors",
    "Profile": "polyprof.engine.scheduled",
    "Limits": "polyprof.merge.limits",
    "ProfileOptions": "polyprof.engine.profile_options",
    "ProfilerAction": "polyprof.engine.schedule",
    "profile": "polyprof.engine.scheduled",
    "schedule": "polyprof.engine.schedule",
    "register_backend": "polyprof.engine.registry",
    "ActivityKind": "polyprof.model",
    "Trace": "polyprof.model",
    "load_trace": "polyprof.formats",
    "write_chrome_trace": "polyprof.formats",
    "write_perfetto_trace": "polyprof.formats",
    "write_trace": "polyprof.formats",
    "ProfilerActivity": "polyprof.profiler",
    "install_torch_profiler": "polyprof.profiler.behind_torch",
    "uninstall_torch_profiler": "polyprof.profiler.behind_torch",
    "listen": "polyprof.ondemand",
    "flight_recorder": "polyprof.flight",
    "FlightRecorder": "polyprof.flight",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)

__all__ = ["__version__", "counter", "instant", "record_function", *_LAZY]
