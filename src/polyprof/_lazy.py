"""Public names of a package that load on first use (PEP 562)::

    __getattr__, __dir__ = lazy_names(globals(), {"Profile": "polyprof.engine.scheduled"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(namespace: dict[str, Any], owners: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for `owners` (public name -> the module that owns it);
    a name, once loaded, is kept in `namespace`."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        owner = owners.get(name)
        if owner is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(owner), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *owners})

    return __getattr__, __dir__
