"""What one backend handed over in one collect (or flush): sealed, immutable, read by the merge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polyprof.model.activities import ActivityTable
from polyprof.model.counters import Counters
from polyprof.model.devices import Device, Resource
from polyprof.model.status import BackendStatus


@dataclass(frozen=True)
class CollectedPart:
    """A backend's rows as columns (read-only arrays), the devices and resources its handles name, its
    counters, metadata and device properties, and its status (the one object the engine keeps writing
    into: the merge counts what the window filter dropped there)."""

    backend: str
    status: BackendStatus
    activities: ActivityTable = field(default_factory=ActivityTable.empty)
    devices: tuple[Device, ...] = ()
    resources: tuple[Resource, ...] = ()
    counters: Counters = field(default_factory=Counters)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    device_properties: tuple[dict[str, Any], ...] = ()
    #: the backend's spans follow the context (asyncio tasks may interleave them on one thread), so the
    #: merge never uses them to refine another backend's External ids (the backend's
    #: ``BackendTraits.context_scoped_spans``)
    context_scoped: bool = False

    @classmethod
    def empty(cls, status: BackendStatus) -> CollectedPart:
        """A part with no rows (an unavailable or failed backend: only its status)."""
        return cls(status.name, status)
