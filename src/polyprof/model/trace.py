"""A whole trace: activities, devices, resources, counters, metadata and per-backend status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyprof.model.activities import ActivityTable
from polyprof.model.counters import Counters
from polyprof.model.devices import Device, Resource

BACKEND_RAN = "ran"
BACKEND_UNAVAILABLE = "unavailable"
BACKEND_FAILED = "failed"


@dataclass
class BackendStatus:
    """What one backend did in one profile, written into the trace's `polyprof` metadata.

    `state` is ``ran`` (it ran; it may still have warnings or errors), ``unavailable`` (its probe said
    no) or ``failed`` (an error stopped it from contributing).
    """

    name: str
    state: str = BACKEND_RAN
    reason: str = ""
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    clock: dict[str, Any] = field(default_factory=dict)
    activities: int = 0
    version: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    attachments: dict[str, Any] = field(default_factory=dict, repr=False)  # in memory only

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        for key in ("reason", "version"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        out["activities"] = self.activities
        for key in ("errors", "warnings", "dropped", "rejected_reasons", "clock", "details"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.rejected:
            out["rejected"] = self.rejected
        return out


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
