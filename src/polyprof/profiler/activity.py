"""``ProfilerActivity``: activity groups as attributes, including those installed plugins add.

Once torch is imported, torch's members are torch's own objects (``ProfilerActivity.CPU is
torch._C._profiler.ProfilerActivity.CPU``), so that they equal, hash and pass ``isinstance`` as torch's
and torch's own classes (``_KinetoProfile``, frameworks' subclasses) take them; a group only a plugin
serves (``ProfilerActivity.OPENCL``) is an :class:`ActivityGroup`, a ``str`` equal to its name, as every
member is where torch is not imported.
"""

from __future__ import annotations

import sys
from typing import Any

#: torch.profiler.ProfilerActivity's members, always present (a backend may or may not serve them).
TORCH_MEMBERS = ("CPU", "CUDA", "XPU", "MTIA", "HPU", "PrivateUse1")


class ActivityGroup(str):
    """An activity group name; compares equal to its name (``ProfilerActivity.CPU == "CPU"``)."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"ProfilerActivity.{self}"


def _torch_enum() -> Any:
    """torch's ProfilerActivity if torch is imported (never importing it), else None."""
    torch = sys.modules.get("torch")
    return getattr(getattr(getattr(torch, "_C", None), "_profiler", None), "ProfilerActivity", None)


def member(name: str) -> Any:
    """The member for a group name: torch's own object where torch has it and is imported."""
    enum = _torch_enum()
    torch_name = next((m for m in TORCH_MEMBERS if m.upper() == name.upper()), None)
    if torch_name is not None:
        found = getattr(enum, torch_name, None)
        return found if found is not None else ActivityGroup(torch_name)
    return ActivityGroup(name.upper())


class _ActivityMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in TORCH_MEMBERS or name.upper() in installed_groups():
            return member(name)
        raise AttributeError(
            f"ProfilerActivity has no member {name!r}; members here: {', '.join(sorted(_members()))}. "
            "A device's member appears when its polyprof plugin is installed (see `polyprof backends`)."
        )

    def __iter__(cls) -> Any:
        return iter(member(m) for m in sorted(_members()))

    def __dir__(cls) -> list[str]:
        return sorted(_members())

    def __instancecheck__(cls, obj: Any) -> bool:
        enum = _torch_enum()
        return isinstance(obj, ActivityGroup) or (enum is not None and isinstance(obj, enum))


def installed_groups() -> set[str]:
    from polyprof.engine.registry import default

    return {a.upper() for e in default.entries(load=False) for a in e.activities}


def _members() -> set[str]:
    return set(TORCH_MEMBERS) | installed_groups()


class ProfilerActivity(metaclass=_ActivityMeta):
    """``ProfilerActivity.CPU``, ``ProfilerActivity.OPENCL``, ... (see the module docstring)."""


def supported_activities() -> set[Any]:
    """The members whose backends are installed and available on this machine (torch's own objects
    for torch's members once torch is imported: ``ProfilerActivity.CPU in supported_activities()``)."""
    from polyprof.engine.registry import default

    groups: set[Any] = set()
    for entry in default.entries():
        if not entry.broken and default.probe(entry).available:
            groups |= {member(a) for a in entry.activities}
    return groups
