"""What one backend did in one profile: one object, written by its session's reporter and by the
engine, serialised once (by the writer, into the trace's ``polyprof.backends`` metadata)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

BACKEND_RAN = "ran"
BACKEND_UNAVAILABLE = "unavailable"
BACKEND_FAILED = "failed"

_LISTS = ("errors", "warnings")
_DICTS = ("dropped", "rejected_reasons", "clock", "details", "timings_ms")


@dataclass
class BackendStatus:
    """`state` is ``ran`` (it ran; it may still have warnings or errors), ``unavailable`` (its probe said
    no) or ``failed`` (an error stopped it from contributing). `timings_ms` holds the engine's phases
    (``stop``, ``collect``, ``flush``); `attachments` are in-memory objects for the front ends, never
    written."""

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
    timings_ms: dict[str, float] = field(default_factory=dict)
    attachments: dict[str, Any] = field(default_factory=dict, repr=False)

    def snapshot(self) -> BackendStatus:
        """A copy as it is now, which later counts (rows a backend's thread hands over after its collect)
        leave alone: the one count that a trace, its summary and its file all show."""
        copy = dataclasses.replace(self)
        for key in _LISTS:
            setattr(copy, key, list(getattr(self, key)))
        for key in _DICTS:
            setattr(copy, key, dict(getattr(self, key)))
        copy.attachments = self.attachments  # in-memory objects, shared
        return copy

    def add_dropped(self, what: str, count: int) -> None:
        if count:
            self.dropped[what] = self.dropped.get(what, 0) + int(count)

    def add_rejected(self, reasons: dict[str, int]) -> None:
        for reason, count in reasons.items():
            if count:
                self.rejected_reasons[reason] = self.rejected_reasons.get(reason, 0) + int(count)
                self.rejected += int(count)

    def add_timing(self, phase: str, ms: float) -> None:
        self.timings_ms[phase] = round(self.timings_ms.get(phase, 0.0) + ms, 3)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        for key in ("reason", "version"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        out["activities"] = self.activities
        for key in (*_LISTS, "dropped", "rejected_reasons", "clock", "details"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.rejected:
            out["rejected"] = self.rejected
        return out

    @classmethod
    def from_json(cls, name: str, doc: dict[str, Any]) -> BackendStatus:
        """The inverse of :meth:`to_json` (for traces read back); unknown or malformed keys are ignored."""
        st = cls(name, str(doc.get("state", BACKEND_RAN)))
        st.reason, st.version = str(doc.get("reason", "")), str(doc.get("version", ""))
        for key in _LISTS:
            if isinstance(doc.get(key), list):
                setattr(st, key, [str(x) for x in doc[key]])
        for key in _DICTS:
            if isinstance(doc.get(key), dict):
                setattr(st, key, dict(doc[key]))
        for key in ("rejected", "activities"):
            value = doc.get(key, 0)
            setattr(st, key, value if isinstance(value, int) and not isinstance(value, bool) else 0)
        return st
