"""``ProfilerActivity``: activity groups as attributes, including those installed plugins add."""

from __future__ import annotations

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


class _ActivityMeta(type):
    def __getattr__(cls, name: str) -> ActivityGroup:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in TORCH_MEMBERS or name.upper() in installed_groups():
            return ActivityGroup(name if name in TORCH_MEMBERS else name.upper())
        raise AttributeError(
            f"ProfilerActivity has no member {name!r}; members here: {', '.join(sorted(_members()))}. "
            "A device's member appears when its polyprof plugin is installed (see `polyprof backends`)."
        )

    def __iter__(cls) -> Any:
        return iter(ActivityGroup(m) for m in sorted(_members()))

    def __dir__(cls) -> list[str]:
        return sorted(_members())


def installed_groups() -> set[str]:
    from polyprof.registry import default

    return {a.upper() for e in default.entries(load=False) for a in e.activities}


def _members() -> set[str]:
    return set(TORCH_MEMBERS) | installed_groups()


class ProfilerActivity(metaclass=_ActivityMeta):
    """``ProfilerActivity.CPU``, ``ProfilerActivity.OPENCL``, ... (see the module docstring)."""


def supported_activities() -> set[ActivityGroup]:
    """The activity groups whose backends are installed and available on this machine."""
    from polyprof.registry import default

    groups: set[ActivityGroup] = set()
    for entry in default.entries():
        if not entry.broken and default.probe(entry).available:
            groups |= {ActivityGroup(a.upper()) for a in entry.activities}
    return groups
