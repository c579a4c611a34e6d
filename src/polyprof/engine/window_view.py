"""The profile as an ``on_trace_ready`` handler sees it. The handler runs on the background writer
while the training thread goes on stepping, so it gets a view whose ``step_num`` is the step its
window ended at; everything else is the profile's own::

    handler(WindowView(profile, step_num))
"""

from __future__ import annotations

from typing import Any


class WindowView:
    """See the module docstring."""

    __slots__ = ("_profile", "step_num")

    def __init__(self, profile: Any, step_num: int) -> None:
        object.__setattr__(self, "_profile", profile)
        object.__setattr__(self, "step_num", step_num)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._profile, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._profile, name, value)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - isinstance(view, type(profile)) holds, as for the profile
        return type(self._profile)

    def __repr__(self) -> str:
        return f"<{type(self._profile).__name__} at step {self.step_num}>"
