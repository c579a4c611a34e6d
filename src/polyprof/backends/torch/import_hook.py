"""Run a callback right after a module is first imported (the torch backend enables itself the moment
a profiled program imports torch, so ``polyprof run train.py`` captures the script's ops)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class PostImportHook:
    """Calls `callback(module)` once, right after `name` has been imported (a meta path finder by its
    methods: importing importlib.abc would cost ``import polyprof`` ~7 ms)::

    hook = PostImportHook("torch", on_torch)
    hook.install()     # removed again after the call, or with hook.remove()
    """

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        loader, hook = spec.loader, self

        class Loader:
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                hook.remove()
                hook.callback(module)

        spec.loader = Loader()
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def import_completed(name: str) -> bool:
    """Whether module `name` is imported and its import has finished (False while it is still running,
    on this thread or another: a thread must not import what depends on it then, e.g. torch.distributed
    during ``import torch``)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)
