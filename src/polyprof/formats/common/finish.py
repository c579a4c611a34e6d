"""The one way a reader finishes a :class:`Trace`: its events read, the document's top-level keys
become its metadata, base time and device properties, and polyprof's own metadata its backends'
statuses (which every reader, JSON or Perfetto, parses here).

::

    trace = finish_trace(doc, activities, devices, resources, counters)
    statuses, timings = statuses_from_metadata(metadata)
"""

from __future__ import annotations

from typing import Any

from polyprof.model import BackendStatus, Counters, Device, Resource, Trace


class Where:
    """What the reader was reading when it met a surprise (for the error line)."""

    __slots__ = ("what",)

    def __init__(self) -> None:
        self.what = "the trace"


#: top-level keys a Chrome trace's own format uses (the rest is the trace's metadata)
JSON_KEYS = ("traceEvents", "deviceProperties", "schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "traceName")


def finish_trace(
    doc: dict[str, Any], acts: Any, devices: list[Device], resources: list[Resource], counters: Counters,
    where: Where | None = None, *, reserved: tuple[str, ...] = JSON_KEYS, base_time_ns: Any = None,
    epoch_offset_ns: int | None = None, window: tuple[int, int] | None = None,
) -> Trace:
    """The trace of the events read (`acts` and the rest) and the document's top-level keys (`doc`: a JSON
    trace's, or a Perfetto trace's metadata event's values): its keys but the `reserved` ones become the
    metadata, polyprof's among them the backends' statuses. `base_time_ns` (else the document's
    ``baseTimeNanoseconds``), `epoch_offset_ns` (else the base: times read back from JSON are relative to
    it) and `window` (else the rows' extent) come from the format where it records them."""
    base = doc.get("baseTimeNanoseconds", 0) if base_time_ns is None else base_time_ns
    base = base if isinstance(base, int) and not isinstance(base, bool) else 0
    metadata = {k: v for k, v in doc.items() if k not in reserved}
    if where is not None:
        where.what = "the polyprof metadata"
    statuses, timings = statuses_from_metadata(metadata)
    if window is None:
        window = (int(acts["start"].min()), int(acts["end"].max())) if len(acts) else (0, 0)
    props = doc.get("deviceProperties") if isinstance(doc.get("deviceProperties"), list) else []
    return Trace(
        activities=acts,
        devices=devices,
        resources=resources,
        counters=counters,
        metadata=metadata,
        device_properties=[p for p in props if isinstance(p, dict)],
        backends=statuses,
        epoch_offset_ns=base if epoch_offset_ns is None else epoch_offset_ns,
        base_time_ns=base,
        window=window,
        timings_ms=timings,
    )


def statuses_from_metadata(metadata: dict) -> tuple[dict[str, BackendStatus], dict[str, Any]]:
    """The backends' statuses and the trace's phase timings out of polyprof's metadata (which keeps
    neither: the trace's statuses are their one owner, serialised again when it is written)."""
    own = metadata.get("polyprof")
    if not isinstance(own, dict):
        return {}, {}
    own = dict(own)
    metadata["polyprof"] = own
    backends, timings = own.pop("backends", None), own.pop("postprocess_ms", None)
    statuses = {
        name: BackendStatus.from_json(name, doc)
        for name, doc in (backends.items() if isinstance(backends, dict) else ())
        if isinstance(doc, dict)
    }
    trace_timings: dict[str, Any] = {}
    for key, value in (timings.items() if isinstance(timings, dict) else ()):
        if isinstance(value, dict) and key in statuses:
            statuses[key].timings_ms = dict(value)
        elif isinstance(value, dict) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            trace_timings[key] = value  # a number, or a phase's parts (merge_passes)
    return statuses, trace_timings
