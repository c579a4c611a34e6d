"""A whole trace: activities, devices, resources, counters, metadata and per-backend status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyprof.model.activities import ActivityTable
from polyprof.model.counters import Counters
from polyprof.model.devices import Device, Resource
from polyprof.model.status import BACKEND_FAILED, BACKEND_RAN, BACKEND_UNAVAILABLE, BackendStatus

__all__ = ["BACKEND_FAILED", "BACKEND_RAN", "BACKEND_UNAVAILABLE", "BackendStatus", "Trace"]


@dataclass
class Trace:
    """The merged result of one profile (or a trace read back from a file).

    Timestamps are host-clock ns; ``host_ns + epoch_offset_ns`` is Unix-epoch ns, and the exporter
    writes times relative to `base_time_ns` (Kineto's `baseTimeNanoseconds`).
    """

    activities: ActivityTable = field(default_factory=ActivityTable.empty)
    devices: list[Device] = field(default_factory=list)
    resources: list[Resource] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    metadata: dict[str, Any] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    backends: dict[str, BackendStatus] = field(default_factory=dict)
    epoch_offset_ns: int = 0
    base_time_ns: int = 0
    window: tuple[int, int] = (0, 0)
    #: the engine's phases for the whole trace (``merge`` and its ``merge_passes``, ``window_end_call``,
    #: ``write``); each backend's are on its status
    timings_ms: dict[str, Any] = field(default_factory=dict)

    @property
    def attachments(self) -> dict[str, Any]:
        """Every backend's in-memory attachments (see ``Reporter.attach``), by key."""
        out: dict[str, Any] = {}
        for st in self.backends.values():
            out.update(st.attachments)
        return out

    def device_by_key(self, key: str) -> Device | None:
        return next((d for d in self.devices if d.key == key), None)

    def kind_mask(self, kind: int) -> np.ndarray:
        return self.activities["kind"] == int(kind)

    def activities_of(self, kind: int) -> list:
        """Materialised rows of one kind (convenient in tests and small scripts)."""
        return [self.activities.row(int(i)) for i in np.flatnonzero(self.kind_mask(kind))]
