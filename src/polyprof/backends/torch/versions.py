"""The torch versions the backend supports."""

from __future__ import annotations

from typing import Any

MIN_TORCH = (2, 4)


def torch_version(torch: Any) -> tuple[int, int]:
    """(major, minor) of an imported torch; (0, 0) when it cannot be read."""
    try:
        major, minor = torch.__version__.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except Exception:
        return (0, 0)
