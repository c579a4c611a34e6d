"""polyprof annotations as torch annotations when it matters.

When a torch-side consumer listens on a thread (torch.profiler, torch.autograd.profiler, an
ExecutionTraceObserver, emit_nvtx...), each ``polyprof.record_function`` also opens a torch
RecordFunction (user scope, its args as the string input, as ``torch.profiler.record_function`` does),
so those consumers see polyprof's annotations; when none listens it stays on polyprof's fast path. The
check and the ranges are C functions of polyprof's torch observer library, called directly from
polyprof's C hot path.

The bridge is armed as soon as torch is imported, if the observer library is already built (setup
builds it; ``python -m polyprof.torch.observer``), and otherwise when a profile first builds it.
Without a C++ compiler there is no bridge: polyprof's annotations are then invisible to torch's own
profiler (polyprof's profiles record them as always).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from polyprof import annotations


class TorchBridge(annotations.FrameworkBridge):
    """The bridge through one loaded observer library (see the module docstring)."""

    def __init__(self, observer: Any) -> None:
        self.lib = observer.lib
        self.c_addresses = observer.bridge_addresses()

    def consumers(self) -> bool:
        return bool(self.lib.polyprof_torch_consumers())

    def enter(self, name: str, text: str | None) -> tuple[Any, int]:
        handle = ctypes.c_uint64(0)
        try:
            rng = self.lib.polyprof_rf_enter(name.encode(), None if text is None else text.encode(), handle)
        except UnicodeEncodeError:  # a lone surrogate: the span stays polyprof's only
            return None, 0
        return rng, int(handle.value)

    def exit(self, rng: Any) -> None:
        self.lib.polyprof_rf_exit(rng)


_armed: TorchBridge | None = None


def install(observer: Any) -> None:
    """Arm the bridge through `observer` (the torch backend calls this once it has the library)."""
    global _armed
    if _armed is None or _armed.lib is not observer.lib:
        _armed = TorchBridge(observer)
        annotations.set_framework_bridge(_armed)


def _arm_from_cache(torch: Any) -> None:
    if _armed is not None or not hasattr(torch, "_C"):
        return
    try:
        from polyprof.torch import observer

        if observer.disabled():
            return
        obs = observer.cached(torch)
    except Exception:  # never break the program's `import torch`
        return
    if obs is not None:
        install(obs)


def arm() -> None:
    """Arm the bridge now if torch is imported, else right after the program imports it. Cheap: nothing
    is built here, only a library already in the cache is loaded."""
    torch = sys.modules.get("torch")
    if torch is not None:
        _arm_from_cache(torch)
        return
    from polyprof.torch.import_hook import PostImportHook

    PostImportHook("torch", _arm_from_cache).install()
