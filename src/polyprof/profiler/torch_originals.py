"""torch.profiler's own names, kept while polyprof stands behind it (:mod:`.behind_torch` fills
``saved``), so that polyprof's classes can build on torch's own whether or not the switch is on.

::

    torch_profile_class = original("profile")
"""

from __future__ import annotations

from typing import Any

#: (module name, name) -> torch's own object, while polyprof is installed behind torch.profiler
saved: dict[tuple[str, str], Any] = {}


def original(name: str) -> Any:
    """torch.profiler's own `name` (``"profile"``...), whether or not polyprof is installed behind it."""
    kept = saved.get(("torch.profiler", name))
    if kept is not None:
        return kept
    import torch.profiler

    return getattr(torch.profiler, name)
