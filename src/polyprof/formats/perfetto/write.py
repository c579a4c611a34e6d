"""Perfetto's native protobuf trace, written from the trace's columns.

::

    from polyprof.formats import write_perfetto_trace
    write_perfetto_trace(trace, "trace.pftrace")          # ".pftrace.gz": gzip written directly

What is in the file (one packet sequence):

- a clock snapshot: timestamps are polyprof's host clock (CLOCK_MONOTONIC, declared the trace's primary
  clock), with CLOCK_REALTIME beside it (the host clock plus the trace's epoch offset);
- a process track per device (the host process and each GPU/queue device, named, labelled and
  sort-ordered as in the JSON), a thread track per host thread, stream or queue; slices that overlap on
  one of them go on sibling tracks of the same name (see :mod:`.order`);
- slices as TYPE_SLICE_BEGIN/END with interned names and categories, args as debug annotations (the
  JSON's ``External id`` and ``correlation`` included), flows (ac2g, fwdbwd) as ``flow_ids`` /
  ``terminating_flow_ids``, instants, counters on counter tracks;
- a ``polyprof: trace metadata`` track with one instant whose debug annotations are the JSON's
  top-level keys (``deviceProperties``, ``distributedInfo``, ``polyprof`` with the backends' status and
  clocks, ...) as JSON values, and what a reader needs to rebuild the devices and rows.

The bytes are streamed in chunks of at most CHUNK_EVENTS events, so a large trace is never held as one
message.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import orjson

from polyprof import _native
from polyprof._native.shared import SLICE_BEGIN, SLICE_END
from polyprof._version import __version__
from polyprof.formats.chrome.write import device_properties, trace_metadata
from polyprof.formats.common.jsonsafe import json_bytes, safe_str
from polyprof.formats.common.paths import check_output_path, trace_output
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto.order import slice_events
from polyprof.formats.perfetto.tracks import SEQUENCE_ID, Tracks, packet, packet_head, stable_uuid
from polyprof.formats.perfetto.wire import (
    field_bytes,
    field_double,
    field_fixed64,
    field_string,
    field_varint,
)
from polyprof.model import FLOW_NAMES, ActivityKind, Trace
from polyprof.model.args import is_json_column, sorted_unique

CHUNK_EVENTS = 65_536
METADATA_TRACK = "polyprof: trace metadata"
METADATA_EVENT = "trace metadata"
#: the debug annotation of the metadata event that tells a reader how tracks map to devices and rows
LAYOUT_KEY = "polyprof.perfetto"
_INT64 = (-(1 << 63), 1 << 63)
# by kind: whether a row's correlation is written as an arg (as in the JSON)
_WRITES_CORRELATION = np.ones(256, dtype=bool)
_WRITES_CORRELATION[
    [int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION), int(ActivityKind.PYTHON_FUNCTION), int(ActivityKind.INSTANT)]
] = False
_KNOWN_FLOW = np.zeros(256, dtype=bool)  # by flow type (as uint8): whether the JSON writes it
_KNOWN_FLOW[list(FLOW_NAMES)] = True


_PACKET_HEAD = packet_head()


def write_perfetto_trace(trace: Trace, path: str | os.PathLike) -> str:
    """Write `trace` to `path` atomically as a Perfetto protobuf trace (gzip when it ends in ``.gz``).
    Returns the path."""
    path = check_output_path(path)
    with trace_output(path) as out:
        _write(trace, out)
    return path


def dumps_perfetto_trace(trace: Trace) -> bytes:
    """The trace as Perfetto protobuf bytes (for small traces and tests)."""
    return b"".join(iter_perfetto_chunks(trace))


def _write(trace: Trace, out: IO[bytes]) -> None:
    for chunk in iter_perfetto_chunks(trace):
        out.write(chunk)


class Interned:
    """Debug annotation names, interned as they are first used; ``take_new`` gives the entries to
    announce before the events that use them."""

    def __init__(self) -> None:
        self.iids: dict[str, int] = {}
        self._new: list[tuple[int, str]] = []

    def iid(self, name: str) -> int:
        iid = self.iids.get(name)
        if iid is None:
            iid = self.iids[name] = len(self.iids) + 1
            self._new.append((iid, name))
        return iid

    def take_new(self) -> bytes:
        entries = b"".join(
            field_bytes(F.INTERNED_ANNOTATION_NAMES, _interned_entry(iid, name)) for iid, name in self._new
        )
        self._new = []
        return entries


def _interned_entry(iid: int, name: str) -> bytes:
    return field_varint(F.INTERNED_IID, iid) + field_string(F.INTERNED_NAME, safe_str(name))


def annotation_value(value: Any) -> bytes:
    """The value fields of a DebugAnnotation for `value`: bool, int64, double and string natively,
    anything else (lists, dicts, None, integers beyond int64) as its JSON text."""
    if isinstance(value, bool):
        return field_varint(F.ANNOTATION_BOOL, int(value))
    if isinstance(value, int) and _INT64[0] <= value < _INT64[1]:
        return field_varint(F.ANNOTATION_INT, value)
    if isinstance(value, float):
        return field_double(F.ANNOTATION_DOUBLE, value) if math.isfinite(value) else _json_value(value)
    if isinstance(value, str):
        return field_string(F.ANNOTATION_STRING, safe_str(value))
    return _json_value(value)


def _json_value(value: Any) -> bytes:
    return field_bytes(F.ANNOTATION_LEGACY_JSON, json_bytes(value))


def annotations(items: dict[str, Any], interned: Interned) -> bytes:
    """The debug_annotations fields of one event."""
    return b"".join(
        field_bytes(F.EVENT_DEBUG_ANNOTATIONS, field_varint(F.ANNOTATION_NAME_IID, interned.iid(str(k))) + annotation_value(v))
        for k, v in items.items()
    )


def iter_perfetto_chunks(
    trace: Trace,
    *,
    sequence_id: int = SEQUENCE_ID,
    stable_tracks: bool = False,
    clock: bool = True,
    metadata: bool = True,
    layout: bool = True,
) -> Iterator[bytes]:
    """The trace file's bytes, in chunks: header and tracks, then the events CHUNK_EVENTS at a time,
    then counters and the metadata event. Several traces written with distinct `sequence_id`s,
    `stable_tracks` and one `clock` snapshot, one after the other, make one valid trace (the Perfetto
    spill appends each flush that way, ``polyprof merge`` each rank; without `layout` a reader places
    rows by the track descriptors)."""
    acts = trace.activities
    strings = acts.strings.strings
    interned = Interned()
    tracks = Tracks(trace, sequence_id, stable_tracks)
    used = lambda column: np.flatnonzero(np.bincount(acts[column], minlength=len(strings))).tolist() if len(acts) else []  # noqa: E731
    names = [(code + 1, strings[code]) for code in used("name")]
    yield header(trace, names, [(code + 1, strings[code]) for code in used("cat")], sequence_id, clock)
    yield tracks.descriptors()
    n = len(acts)
    if n:
        c = acts.columns
        kind = c["kind"]
        instant = kind == int(ActivityKind.INSTANT)
        resource = c["resource"].astype(np.int64)
        events, lane = slice_events(resource, c["start"], c["end"], instant)
        track = np.array(tracks.resource_uuid or [0], dtype=np.int64)[resource]
        over = np.flatnonzero(lane > 0)
        lanes, which = _lanes_used(resource[over], lane[over])
        track[over] = np.array([tracks.lane(r, k) for r, k in lanes], dtype=np.int64)[which] if lanes else 0
        yield tracks.lane_descriptors(lanes)
        writes_corr = (c["correlation"] != 0) & _WRITES_CORRELATION[kind]
        known = _KNOWN_FLOW[c["flow_type"].astype(np.uint8)]
        flow_key = np.where((c["flow_id"] != 0) & known, c["flow_id"] * 4 + c["flow_type"], 0)
        rows = _RowEncoder(acts, interned, track, writes_corr, flow_key)
        for lo in range(0, len(events), CHUNK_EVENTS):
            body = rows.encode(events[lo : lo + CHUNK_EVENTS], tracks.head)
            new = interned.take_new()
            yield (interned_packet(new, tracks.head) if new else b"") + body
    yield counter_packets(trace, tracks)
    if metadata:
        meta = metadata_packet(trace, tracks, interned, layout)
        yield interned_packet(interned.take_new(), tracks.head) + meta


def _lanes_used(resource: np.ndarray, lane: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The distinct (resource, lane) pairs of the rows that went to a lane, in order, and which pair
    each row's is. By counting where the pairs fit a small table (~20x faster than sorting them), else
    by sorting."""
    if not len(lane):
        return [], np.zeros(0, dtype=np.int64)
    width = int(lane.max()) + 1
    size = (int(resource.max()) + 1) * width
    code = resource.astype(np.int64, copy=False) * width + lane
    if size > 4 * len(lane) + 4096:  # many lanes on many rows: a table would be mostly empty
        codes, which = np.unique(code, return_inverse=True)
        which = which.ravel()
    else:
        present = np.bincount(code, minlength=size) > 0
        codes, which = np.flatnonzero(present), (np.cumsum(present) - 1)[code]
    return [divmod(k, width) for k in codes.tolist()], which


def header(
    trace: Trace, names: list[tuple[int, str]], categories: list[tuple[int, str]], sequence_id: int = SEQUENCE_ID,
    clock: bool = True,
) -> bytes:
    """Clock snapshot (with `clock`), then the packet that starts the sequence: defaults (the clock)
    and the interned event names and categories ((iid, text) pairs)."""
    interned = b"".join(field_bytes(F.INTERNED_NAMES, _interned_entry(iid, name)) for iid, name in names)
    interned += b"".join(field_bytes(F.INTERNED_CATEGORIES, _interned_entry(iid, name)) for iid, name in categories)
    start = field_varint(F.PACKET_SEQUENCE_ID, sequence_id)
    start += field_varint(F.PACKET_SEQUENCE_FLAGS, F.SEQ_INCREMENTAL_STATE_CLEARED | F.SEQ_NEEDS_INCREMENTAL_STATE)
    start += field_varint(F.PACKET_FIRST_ON_SEQUENCE, 1)
    start += field_bytes(F.PACKET_DEFAULTS, field_varint(F.DEFAULTS_TIMESTAMP_CLOCK_ID, F.CLOCK_MONOTONIC))
    start += field_bytes(F.PACKET_INTERNED_DATA, interned)
    return (clock_packet(int(trace.window[0]), int(trace.epoch_offset_ns), sequence_id) if clock else b"") + packet(start)


def clock_packet(t0: int, epoch_offset_ns: int, sequence_id: int = SEQUENCE_ID) -> bytes:
    """The clock snapshot: polyprof's host clock (CLOCK_MONOTONIC, the trace's primary clock) at `t0`
    and CLOCK_REALTIME beside it, `epoch_offset_ns` later."""
    t0 = max(0, t0)
    clocks = field_bytes(F.SNAPSHOT_CLOCKS, field_varint(F.CLOCK_ID, F.CLOCK_MONOTONIC) + field_varint(F.CLOCK_TIMESTAMP, t0))
    realtime = max(0, t0 + epoch_offset_ns)
    clocks += field_bytes(F.SNAPSHOT_CLOCKS, field_varint(F.CLOCK_ID, F.CLOCK_REALTIME) + field_varint(F.CLOCK_TIMESTAMP, realtime))
    snapshot = field_bytes(F.PACKET_CLOCK_SNAPSHOT, clocks + field_varint(F.SNAPSHOT_PRIMARY_CLOCK, F.CLOCK_MONOTONIC))
    snapshot += field_varint(F.PACKET_TIMESTAMP, t0) + field_varint(F.PACKET_TIMESTAMP_CLOCK_ID, F.CLOCK_MONOTONIC)
    return packet(snapshot + field_varint(F.PACKET_SEQUENCE_ID, sequence_id))


def interned_packet(entries: bytes, head: bytes = _PACKET_HEAD) -> bytes:
    return packet(head + field_bytes(F.PACKET_INTERNED_DATA, entries)) if entries else b""


def _event_packet(ts: int, event: bytes, head: bytes = _PACKET_HEAD) -> bytes:
    return packet(field_varint(F.PACKET_TIMESTAMP, max(0, ts)) + head + field_bytes(F.PACKET_TRACK_EVENT, event))


class _RowEncoder:
    """Encodes the begin, end and instant events of the activity rows: the columns once, each row's
    args once (rows with equal args share their encoding), then the packets chunk by chunk, in C
    (``_native.encode_events``) or by the reference :func:`encode_events_py`."""

    def __init__(self, acts: Any, interned: Interned, track: np.ndarray, writes_corr: np.ndarray, flow_key: np.ndarray) -> None:
        c = acts.columns
        self.ext_iid, self.corr_iid = interned.iid("External id"), interned.iid("correlation")
        self.blobs: list[bytes | None] = [None] * len(acts)
        cache: dict[bytes, bytes] = {}  # JSON of a row's args -> its annotations
        writes_corr = writes_corr.copy()
        in_blocks = [b.rows for b in acts.args.blocks]
        block_rows = sorted_unique(np.concatenate(in_blocks)) if in_blocks else np.zeros(0, np.int64)
        own = acts.args.dicts
        done = self._json_blocks(acts.args, interned, writes_corr)
        if done is not None:
            block_rows_left = block_rows[~done[block_rows]]
        else:
            block_rows_left = block_rows
        merged = ((row, acts.args[row]) for row in block_rows_left.tolist())  # block keys and the row's own
        blocked = frozenset(block_rows.tolist())
        alone = ((row, a) for row, a in own.items() if row not in blocked) if blocked else own.items()
        blobs, dumps = self.blobs, orjson.dumps
        for row, args in itertools.chain(merged, alone):
            if not args:
                continue
            if "correlation" in args:
                writes_corr[row] = False  # the row's own arg is written instead
            try:
                key = dumps(args)
            except (TypeError, orjson.JSONEncodeError):  # values JSON cannot hold: their safe form
                key = json_bytes(args)
            blob = cache.get(key)
            if blob is None:
                blob = cache[key] = annotations(args, interned)
            blobs[row] = blob
        i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
        self.cols = (
            i64(track), i64(c["start"]), i64(np.maximum(c["end"], c["start"])), i64(c["name"]) + 1, i64(c["cat"]) + 1,
            i64(c["external_id"]), i64(c["correlation"]), i64(writes_corr), i64(flow_key), i64(c["flow_start"] != 0),
        )

    def _json_blocks(self, args: Any, interned: Interned, writes_corr: np.ndarray) -> np.ndarray | None:
        """The blobs of rows whose args are one block of JSON-encoded columns (a trace read back), encoded
        in C from the JSON text (``_native.encode_json_args``); a mask of the rows done (None: none).
        Rows in several blocks or with a dict too, and values C leaves to Python, take the general path."""
        blocks = args.blocks
        if not blocks or not all(all(is_json_column(c) for c in b.columns) for b in blocks):
            return None
        rows_all = np.concatenate([b.rows for b in blocks])
        if len(blocks) > 1 and len(sorted_unique(rows_all)) != len(rows_all):
            return None  # a row in several blocks: its args are their union
        done = np.zeros(len(self.blobs), dtype=bool)
        for block in blocks:
            rows = np.ascontiguousarray(block.rows, dtype=np.int64)
            if args.dicts:
                lone = np.fromiter((r not in args.dicts for r in rows.tolist()), dtype=bool, count=len(rows))
            else:
                lone = np.ones(len(rows), dtype=bool)
            at = np.flatnonzero(lone)
            iids = tuple(interned.iid(str(k)) for k in block.keys)
            whole = len(at) == len(rows)
            values = [c.tolist() if whole else c[at].tolist() for c in block.columns]
            left = _native.encode_json_args(rows[at], iids, values, self.blobs)
            if left is None:  # declined (without the extension: at the first block, nothing done yet)
                return None if not done.any() else done
            ok = np.ones(len(at), dtype=bool)
            ok[left] = False
            finished = rows[at][ok]
            done[finished] = True
            if "correlation" in block.keys:
                values = block.columns[block.keys.index("correlation")][at][ok]
                with_corr = np.fromiter(map(len, values), dtype=np.int64, count=len(values)) > 0
                writes_corr[finished[with_corr]] = False  # the row's own arg is written instead
        return done

    def encode(self, events: np.ndarray, head: bytes) -> bytes:
        work = (np.ascontiguousarray(events, dtype=np.int64), self.cols, self.blobs, self.ext_iid, self.corr_iid)
        return encode_events(work, head)


def encode_events(work: tuple[np.ndarray, tuple[np.ndarray, ...], list[bytes | None], int, int], head: bytes = _PACKET_HEAD) -> bytes:
    """The packets of (events, columns, blobs, External id iid, correlation iid): in C
    (``_native.encode_events``), else by the reference :func:`encode_events_py`."""
    events, cols, blobs, ext_iid, corr_iid = work
    encoded = _native.encode_events(events, cols, blobs, ext_iid, corr_iid, head)
    return encode_events_py(events, cols, blobs, ext_iid, corr_iid, head) if encoded is None else encoded


def encode_events_py(
    events: np.ndarray, cols: tuple[np.ndarray, ...], blobs: list[bytes | None], ext_iid: int, corr_iid: int, head: bytes
) -> bytes:
    """The reference encoder, which ``_native.encode_events`` gives in C (the same bytes)."""
    track, start, end, name, cat, ext, corr, writes_corr, flow_key, flow_start = (c.tolist() for c in cols)
    out = []
    for code in events.tolist():
        row, phase = code >> 2, code & 3
        if phase == SLICE_END:
            event = field_varint(F.EVENT_TYPE, F.TYPE_SLICE_END) + field_varint(F.EVENT_TRACK_UUID, track[row])
            out.append(_event_packet(end[row], event, head))
            continue
        kind = F.TYPE_SLICE_BEGIN if phase == SLICE_BEGIN else F.TYPE_INSTANT
        event = field_varint(F.EVENT_TYPE, kind) + field_varint(F.EVENT_TRACK_UUID, track[row])
        event += field_varint(F.EVENT_NAME_IID, name[row]) + field_varint(F.EVENT_CATEGORY_IIDS, cat[row])
        if ext[row]:
            event += field_bytes(F.EVENT_DEBUG_ANNOTATIONS, field_varint(F.ANNOTATION_NAME_IID, ext_iid) + field_varint(F.ANNOTATION_INT, ext[row]))
        if writes_corr[row]:
            event += field_bytes(F.EVENT_DEBUG_ANNOTATIONS, field_varint(F.ANNOTATION_NAME_IID, corr_iid) + field_varint(F.ANNOTATION_INT, corr[row]))
        event += blobs[row] or b""
        if flow_key[row]:
            event += field_fixed64(F.EVENT_FLOW_IDS if flow_start[row] else F.EVENT_TERMINATING_FLOW_IDS, flow_key[row])
        out.append(_event_packet(start[row], event, head))
    return b"".join(out)


def counter_packets(trace: Trace, tracks: Tracks) -> bytes:
    cols = trace.counters.columns
    if not len(cols["ts"]):
        return b""
    names = trace.counters.strings.strings
    order = np.argsort(cols["ts"], kind="stable")
    descriptors, events = [], []
    for i in order.tolist():
        device, resource, name = int(cols["device"][i]), int(cols["resource"][i]), names[int(cols["name"][i])]
        key = (device, resource, name)
        if key not in tracks.counters:
            descriptors.append(tracks.counter_descriptor(tracks.counter(*key), device, name))
        event = field_varint(F.EVENT_TYPE, F.TYPE_COUNTER) + field_varint(F.EVENT_TRACK_UUID, tracks.counters[key])
        event += field_double(F.EVENT_DOUBLE_COUNTER_VALUE, float(cols["value"][i]))
        events.append(_event_packet(int(cols["ts"][i]), event, tracks.head))
    return b"".join(descriptors) + b"".join(events)


def layout(trace: Trace, tracks: Tracks) -> dict[str, Any]:
    """What a reader needs beyond the descriptors: each device as the model has it, and which track is
    which row (lanes included)."""
    return {
        "version": __version__,
        "devices": [
            {"key": d.key, "type": d.type, "index": d.index, "name": d.name, "pid": d.pid, "label": d.label,
             "sort_index": d.sort_index, "track": uuid}
            for d, uuid in zip(trace.devices, tracks.device_uuid, strict=True)
        ],
        "rows": [
            {"device": r.device, "tid": r.id, "name": r.name, "sort_index": r.sort_index, "track": uuid}
            for r, uuid in zip(trace.resources, tracks.resource_uuid, strict=True)
        ],
        "lanes": [[resource, uuid] for (resource, _), uuid in sorted(tracks.lanes.items())],
        "counters": [[device, resource, uuid] for (device, resource, _), uuid in tracks.counters.items()],
        "window": [int(trace.window[0]), int(trace.window[1])],
        "base_time_ns": int(trace.base_time_ns),
        "epoch_offset_ns": int(trace.epoch_offset_ns),
    }


def metadata_values(trace: Trace) -> dict[str, Any]:
    """What the metadata event holds but the layout: the JSON's top-level keys."""
    values: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": device_properties(trace)}
    values.update(trace_metadata(trace))
    values["baseTimeNanoseconds"] = int(trace.base_time_ns)
    return values


def _metadata_packets(values: dict[str, Any], uuid: int, ts: int, sequence_id: int, head: bytes, key: Any) -> bytes:
    """The metadata track (`uuid`) and its one instant at `ts`: `values` as JSON-valued annotations,
    each named by ``key(name)`` (an interned iid or the name inline)."""
    track = field_varint(F.TRACK_UUID, uuid) + field_string(F.TRACK_NAME, METADATA_TRACK)
    body = b"".join(field_bytes(F.EVENT_DEBUG_ANNOTATIONS, key(str(k)) + _json_value(v)) for k, v in values.items())
    event = field_varint(F.EVENT_TYPE, F.TYPE_INSTANT) + field_varint(F.EVENT_TRACK_UUID, uuid)
    event += field_string(F.EVENT_NAME, METADATA_EVENT) + body
    descriptor = packet(field_varint(F.PACKET_SEQUENCE_ID, sequence_id) + field_bytes(F.PACKET_TRACK_DESCRIPTOR, track))
    return descriptor + _event_packet(ts, event, head)


def standalone_metadata(values: dict[str, Any], ts: int, sequence_id: int) -> bytes:
    """The metadata track and its instant holding `values`, on a packet sequence of their own with
    every name inline (no interned state): what ``polyprof merge`` writes after a rank's packets."""
    head = field_varint(F.PACKET_SEQUENCE_ID, sequence_id)
    inline = lambda k: field_string(F.ANNOTATION_NAME, safe_str(k))  # noqa: E731
    return _metadata_packets(values, stable_uuid("metadata"), ts, sequence_id, head, inline)


def metadata_packet(trace: Trace, tracks: Tracks, interned: Interned, with_layout: bool = True) -> bytes:
    """The metadata track and its one instant: the JSON's top-level keys as JSON-valued annotations."""
    values = metadata_values(trace)
    if with_layout:
        values[LAYOUT_KEY] = layout(trace, tracks)
    iid = lambda k: field_varint(F.ANNOTATION_NAME_IID, interned.iid(k))  # noqa: E731
    return _metadata_packets(values, tracks.metadata_uuid, int(trace.window[0]), tracks.sequence_id, tracks.head, iid)
