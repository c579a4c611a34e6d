"""Run a callback right after a module is first imported (the torch backend enables itself the moment
a profiled program imports torch, so ``polyprof run train.py`` captures the script's ops)."""

from __future__ import annotations

import sys

from _polyprof_startup import PostImportHook  # (the start-up hook's own: one finder for both)

__all__ = ["PostImportHook", "import_completed"]


def import_completed(name: str) -> bool:
    """Whether module `name` is imported and its import has finished (False while it is still running,
    on this thread or another: a thread must not import what depends on it then, e.g. torch.distributed
    during ``import torch``)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)
