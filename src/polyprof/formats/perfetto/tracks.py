"""The track tree of a Perfetto trace written by polyprof, and the packets that carry it.

::

    from polyprof.formats.perfetto.tracks import Tracks
    tracks = Tracks(trace)                 # uuids for every device, row, lane and counter track
    out.write(tracks.descriptors())        # their TrackDescriptor packets, on sequence 1
"""

from __future__ import annotations

import hashlib
from typing import Any

from polyprof.formats.common.jsonsafe import safe_str
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto.wire import field_bytes, field_string, field_varint
from polyprof.model import Trace

SEQUENCE_ID = 1


def packet_head(sequence_id: int = SEQUENCE_ID) -> bytes:
    """What every event packet carries after its timestamp: its sequence and "uses interned data"."""
    return field_varint(F.PACKET_SEQUENCE_ID, sequence_id) + field_varint(F.PACKET_SEQUENCE_FLAGS, F.SEQ_NEEDS_INCREMENTAL_STATE)


def packet(body: bytes) -> bytes:
    """One ``Trace.packet`` field holding the TracePacket `body`."""
    return field_bytes(F.TRACE_PACKET, body)


def stable_uuid(*what: Any) -> int:
    """A track uuid that comes from what the track is (below 2**62, never 0)."""
    digest = hashlib.blake2b(repr(what).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) | 1


class Tracks:
    """The track tree: uuids of device (process) tracks, row (thread) tracks, lanes and counter tracks,
    and their descriptors, on one packet sequence. With `stable`, a track's uuid comes from what it is
    (device key, thread id, lane, counter name), so that traces appended to one file share their tracks
    (the Perfetto spill); else uuids count up from 1."""

    def __init__(self, trace: Trace, sequence_id: int = SEQUENCE_ID, stable: bool = False) -> None:
        self.trace = trace
        self.sequence_id = sequence_id
        self.head = packet_head(sequence_id)
        self.stable = stable
        self.next_uuid = 1
        self.device_uuid = [self._new("device", d.key) for d in trace.devices]
        self.resource_uuid = [self._new("row", trace.devices[r.device].key, r.id) for r in trace.resources]
        self.lanes: dict[tuple[int, int], int] = {}  # (resource, lane >= 1) -> uuid
        self.counters: dict[tuple[int, int, str], int] = {}
        self.metadata_uuid = self._new("metadata")

    def _new(self, *what: Any) -> int:
        if self.stable:
            return stable_uuid(*what)
        uuid, self.next_uuid = self.next_uuid, self.next_uuid + 1
        return uuid

    def lane(self, resource: int, lane: int) -> int:
        key = (resource, lane)
        if key not in self.lanes:
            r = self.trace.resources[resource]
            self.lanes[key] = self._new("lane", self.trace.devices[r.device].key, r.id, lane)
        return self.lanes[key]

    def counter(self, device: int, resource: int, name: str) -> int:
        key = (device, resource, name)
        if key not in self.counters:
            tid = self.trace.resources[resource].id if resource >= 0 else None
            self.counters[key] = self._new("counter", self.trace.devices[device].key, tid, name)
        return self.counters[key]

    def descriptors(self) -> bytes:
        out = []
        for d, uuid in zip(self.trace.devices, self.device_uuid, strict=True):
            process = field_varint(F.PROCESS_PID, d.pid) + field_varint(F.PROCESS_LEGACY_SORT_INDEX, d.sort_index)
            process += field_string(F.PROCESS_NAME, safe_str(d.name))
            if d.label:
                process += field_string(F.PROCESS_LABELS, safe_str(d.label))
            body = field_varint(F.TRACK_UUID, uuid) + field_bytes(F.TRACK_PROCESS, process)
            body += field_varint(F.TRACK_CHILD_ORDERING, F.CHILD_ORDERING_EXPLICIT)
            out.append(self._descriptor(body))
        for r, uuid in zip(self.trace.resources, self.resource_uuid, strict=True):
            pid = self.trace.devices[r.device].pid
            thread = field_varint(F.THREAD_PID, pid) + field_varint(F.THREAD_TID, r.id)
            thread += field_varint(F.THREAD_LEGACY_SORT_INDEX, r.sort_index) + field_string(F.THREAD_NAME, safe_str(r.name))
            body = field_varint(F.TRACK_UUID, uuid) + field_varint(F.TRACK_PARENT_UUID, self.device_uuid[r.device])
            body += field_bytes(F.TRACK_THREAD, thread) + field_varint(F.TRACK_SIBLING_ORDER_RANK, 2 * r.sort_index)
            out.append(self._descriptor(body))
        return b"".join(out)

    def lane_descriptors(self, lanes: list[tuple[int, int]]) -> bytes:
        """Sibling tracks for overlapping slices: same name as their row, ordered right after it."""
        out = []
        for resource, lane in lanes:
            r = self.trace.resources[resource]
            body = field_varint(F.TRACK_UUID, self.lane(resource, lane))
            body += field_varint(F.TRACK_PARENT_UUID, self.device_uuid[r.device]) + field_string(F.TRACK_NAME, safe_str(r.name))
            body += field_string(F.TRACK_DESCRIPTION, f"slices that overlap others on {safe_str(r.name)} (lane {lane})")
            body += field_varint(F.TRACK_SIBLING_ORDER_RANK, 2 * r.sort_index + 1)
            out.append(self._descriptor(body))
        return b"".join(out)

    def counter_descriptor(self, uuid: int, device: int, name: str) -> bytes:
        body = field_varint(F.TRACK_UUID, uuid) + field_varint(F.TRACK_PARENT_UUID, self.device_uuid[device])
        body += field_string(F.TRACK_NAME, safe_str(name)) + field_bytes(F.TRACK_COUNTER, b"")
        return self._descriptor(body)

    def _descriptor(self, body: bytes) -> bytes:
        return packet(field_varint(F.PACKET_SEQUENCE_ID, self.sequence_id) + field_bytes(F.PACKET_TRACK_DESCRIPTOR, body))
