"""polyprof behind ``torch.profiler``: frameworks that create torch's profiler themselves get polyprof's.

::

    import polyprof
    polyprof.install_torch_profiler()      # torch.profiler.profile, schedule, ... are polyprof's now
    ...                                    # Lightning, accelerate, transformers, your own code
    polyprof.uninstall_torch_profiler()    # torch's own again

    POLYPROF_TORCH_PROFILER=1 python train.py     # the same, from the interpreter's start (.pth hook)
    polyprof run train.py                         # the same (--no-torch-profiler leaves torch's)

While installed, ``torch.profiler.profile``, ``torch.profiler.schedule``,
``torch.profiler.tensorboard_trace_handler``, ``torch.profiler.ProfilerActivity`` (whose torch members
are torch's own objects) and ``torch.profiler.supported_activities`` (what polyprof's backends can
record here, plugins' groups included) are polyprof's, and so are ``profile``, ``schedule`` and
``tensorboard_trace_handler`` reached through ``torch.profiler.profiler`` (that module's own
``ProfilerActivity`` and ``supported_activities`` stay torch's: torch's own classes use them). The
installed ``profile`` class:

* has exactly torch's ``__init__`` signature (frameworks filter their keyword arguments by it); polyprof's
  own settings come from ``POLYPROF_ACTIVITIES`` and the configuration file, as for every
  ``polyprof.profiler.profile`` (see :mod:`polyprof.profiler.settings`);
* is a subclass of ``polyprof.profiler.profile``, which is a subclass of torch's original class, and
  ``isinstance(p, torch.profiler.profile)`` holds for profiles made before the switch (torch's) and for
  every ``polyprof.profiler.profile`` too;
* its lifecycle is torch's code (see :mod:`polyprof.profiler.torch_profile`).

A profiler made with torch's original class (captured before the switch, or ``original("profile")``)
stays torch's; only one profiler records ops at a time, as with torch alone (the second to start raises
torch's or polyprof's error saying so).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from polyprof.profiler.torch_originals import original, saved

#: the names put in place in torch.profiler, and those also in torch.profiler.profiler
NAMES = ("profile", "schedule", "tensorboard_trace_handler", "ProfilerActivity", "supported_activities")
MODULE_NAMES = ("profile", "schedule", "tensorboard_trace_handler")
ENV = "POLYPROF_TORCH_PROFILER"

_installed_class: type | None = None


def torch_profiler_installed() -> bool:
    """Whether polyprof stands behind torch.profiler now."""
    return bool(saved)


def install_torch_profiler() -> None:
    """Put polyprof behind torch.profiler (see the module docstring); imports torch. Idempotent."""
    if saved:
        return
    from polyprof.extras import require

    require("torch", "putting polyprof behind torch.profiler")
    import torch.profiler
    import torch.profiler.profiler as torch_profiler_module

    import polyprof.profiler as polyprof_profiler

    replacements = {
        "profile": installed_class(),
        "schedule": polyprof_profiler.schedule,
        "tensorboard_trace_handler": polyprof_profiler.tensorboard_trace_handler,
        "ProfilerActivity": polyprof_profiler.ProfilerActivity,
        "supported_activities": polyprof_profiler.supported_activities,
    }
    for module, names in ((torch.profiler, NAMES), (torch_profiler_module, MODULE_NAMES)):
        for name in names:
            saved[(module.__name__, name)] = getattr(module, name)
            setattr(module, name, replacements[name])


def uninstall_torch_profiler() -> None:
    """Give torch.profiler its own names back. Profiles already made stay what they are."""
    for (module_name, name), value in list(saved.items()):
        setattr(sys.modules[module_name], name, value)
    saved.clear()


def installed_class() -> type:
    """The class installed as torch.profiler.profile: polyprof.profiler.profile with torch's exact
    signature, polyprof's settings from the environment and configuration file."""
    global _installed_class
    if _installed_class is not None:
        return _installed_class
    import polyprof.profiler as polyprof_profiler

    base = polyprof_profiler.profile
    torch_class = original("profile")
    signature = inspect.signature(torch_class.__init__)

    class _StandsForTorch(type(base)):  # type: ignore[misc]
        """isinstance/issubclass against the installed class answer as against torch's own class, so
        that torch profilers made before the switch and every polyprof.profiler.profile pass."""

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, torch_class)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, torch_class)

    class profile(base, metaclass=_StandsForTorch):  # type: ignore[valid-type,misc]  # noqa: N801
        __doc__ = torch_class.__doc__
        __module__ = "torch.profiler.profiler"
        _lenient_settings = True  # a framework's profiler never fails mid-run on a broken setting (said once)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(self, *args, **kwargs)  # torch's TypeError for what torch would refuse
            given = {k: v for k, v in bound.arguments.items() if k != "self"}
            base.__init__(self, **given)

    profile.__init__.__signature__ = signature  # type: ignore[attr-defined]
    profile.__qualname__ = "profile"
    _installed_class = profile
    return profile


def install_when_torch_is_imported() -> None:
    """For the start-up hook: install now if torch is imported, else the moment it is (never importing
    torch itself). A failure is said on stderr; the program goes on with torch's profiler."""

    def install(_torch: Any = None) -> None:
        try:
            install_torch_profiler()
        except Exception as exc:
            print(f"polyprof: {ENV} is set but torch.profiler could not be switched to polyprof: {exc}",
                  file=sys.stderr)

    if "torch" in sys.modules and hasattr(sys.modules["torch"], "profiler"):
        install()
        return
    from polyprof.torch.import_hook import PostImportHook

    PostImportHook("torch", install).install()

