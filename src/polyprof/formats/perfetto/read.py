"""Reading Perfetto protobuf traces (polyprof's ``.pftrace`` first, TrackEvent traces of other writers
as far as they go) into a Trace, so every analysis works on either format.

::

    from polyprof.formats import load_trace
    trace = load_trace("trace.pftrace")      # load_trace tells the formats apart by their bytes

What polyprof wrote comes back as it was: devices and rows (from the layout in the metadata event),
slices with their names, categories, args, External id, correlation and flows, instants, counters,
the JSON's top-level metadata (backends' status included) and the clock. Anything malformed is a
:class:`polyprof.errors.TraceFormatError` naming the file and the problem, in one line.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import orjson

from polyprof.errors import TraceFormatError
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto.wire import LENGTH, WireError, as_double, as_int64, fields, read_varint
from polyprof.formats.perfetto.write import LAYOUT_KEY, METADATA_EVENT, METADATA_TRACK
from polyprof.model import (
    FLOW_AC2G,
    ActivityBuilder,
    ActivityKind,
    Counters,
    Device,
    Resource,
    Trace,
    kind_from_category,
)

_RESERVED = ("deviceProperties", "schemaVersion", "baseTimeNanoseconds", "displayTimeUnit", "traceName", LAYOUT_KEY)


def looks_like_perfetto(data: bytes) -> bool:
    """Whether `data` (inflated) starts like a protobuf Trace rather than JSON."""
    head = data[:64].lstrip()
    return bool(data) and data[:1] == b"\x0a" and not head.startswith((b"{", b"["))


def is_perfetto_file(path: str) -> bool:
    """Whether the file at `path` (gzip or not) holds a Perfetto trace, from its first bytes."""
    from polyprof.formats.common.source import open_stream

    with open_stream(path) as f:
        return looks_like_perfetto(f.read(64))


def parse_perfetto(data: bytes, path: str = "<trace>", *, tolerate_torn: bool = False) -> Trace:
    """A trace from Perfetto protobuf bytes, read by the reference reader (`path` names it in errors;
    :func:`polyprof.formats.parse_trace` tries the C packet scanner first). With `tolerate_torn` (a spill
    whose writer was killed), a last packet cut short is left out (``reader.torn_bytes``) instead of
    being an error."""
    return read_with(PacketReader(path, tolerate_torn), data)


def read_with(reader: PacketReader, data: bytes) -> Trace:
    """`reader`'s trace of `data`, every surprise a one-line TraceFormatError."""
    path = reader.path
    try:
        return reader.read(data)
    except TraceFormatError:
        raise
    except WireError as exc:
        raise TraceFormatError(f"{path}: packet {reader.packet} is not valid protobuf ({exc})") from None
    except Exception as exc:  # any other structural surprise: one line, never a traceback
        raise TraceFormatError(
            f"{path}: packet {reader.packet} is malformed ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None


def _message(value: Any, what: str) -> memoryview:
    if not isinstance(value, memoryview):
        raise WireError(f"{what} is not a message")
    return value


def _text(value: Any) -> str:
    return bytes(_message(value, "a string")).decode("utf-8", "replace")


class _Event(NamedTuple):
    """A slice's begin or an instant as read (a tuple: a large trace holds millions)."""

    track: int
    ts: int
    name: str
    cat: str
    args: dict[str, Any] | None
    flows: list[tuple[int, bool]] | None
    instant: bool


class _Track:
    __slots__ = ("uuid", "parent", "name", "pid", "tid", "process_name", "labels", "sort_index", "is_counter")

    def __init__(self, uuid: int) -> None:
        self.uuid, self.parent, self.name = uuid, 0, ""
        self.pid: int | None = None
        self.tid: int | None = None
        self.process_name = ""
        self.labels: list[str] = []
        self.sort_index = 0
        self.is_counter = False


class PacketReader:
    def __init__(self, path: str, tolerate_torn: bool = False) -> None:
        self.path = path
        self.tolerate_torn = tolerate_torn
        self.torn_bytes = 0
        self.packet = 0
        self.sequences: set[int] = set()
        self.tracks: dict[int, _Track] = {}
        self.interned: dict[tuple[int, int], dict[int, str]] = defaultdict(dict)  # (sequence, kind) -> iid -> str
        self.open: dict[int, list[_Event]] = defaultdict(list)
        self.slices: list[tuple[_Event, int]] = []  # (begin, end ts)
        self.instants: list[_Event] = []
        self.counter_samples: list[tuple[int, int, float]] = []  # (track, ts, value)
        self.snapshot: dict[int, int] = {}
        self.metadata: dict[str, Any] | None = None

    # -- the packets ----------------------------------------------------------------------------
    def read(self, data: bytes) -> Trace:
        view, pos = memoryview(data), 0
        while pos < len(view):
            try:
                key, body_at = read_varint(view, pos)
                size, body_at = read_varint(view, body_at)
                if key != (F.TRACE_PACKET << 3 | LENGTH):
                    raise WireError(f"a Trace holds packets (field 1), not field {key >> 3}")
                if body_at + size > len(view):
                    raise WireError(f"packet {self.packet + 1} is {size} bytes long, past the end of the file")
            except WireError:
                if not self.tolerate_torn:
                    raise
                self.torn_bytes = len(view) - pos
                break
            self.packet += 1
            self._packet(view[body_at : body_at + size])
            pos = body_at + size
        if self.packet == 0:
            raise TraceFormatError(f"{self.path}: no packets (an empty or non-Perfetto file)")
        return self._trace()

    def _packet(self, buf: memoryview) -> None:
        ts, seq, flags = 0, 0, 0
        event = descriptor = interned = snapshot = None
        for number, _, value in fields(buf):
            if number == F.PACKET_TIMESTAMP:
                ts = int(value)
            elif number == F.PACKET_SEQUENCE_ID:
                seq = int(value)
            elif number == F.PACKET_SEQUENCE_FLAGS:
                flags = int(value)
            elif number == F.PACKET_TRACK_EVENT:
                event = _message(value, "track_event")
            elif number == F.PACKET_TRACK_DESCRIPTOR:
                descriptor = _message(value, "track_descriptor")
            elif number == F.PACKET_INTERNED_DATA:
                interned = _message(value, "interned_data")
            elif number == F.PACKET_CLOCK_SNAPSHOT:
                snapshot = _message(value, "clock_snapshot")
        self.sequences.add(seq)
        if flags & F.SEQ_INCREMENTAL_STATE_CLEARED:
            for key in [k for k in self.interned if k[0] == seq]:
                del self.interned[key]
        if interned is not None:
            self._interned(seq, interned)
        if snapshot is not None:
            self.clock_snapshot(snapshot)
        if descriptor is not None:
            self.descriptor(descriptor)
        if event is not None:
            self._event(seq, ts, event)

    def _interned(self, seq: int, buf: memoryview) -> None:
        for number, _, value in fields(buf):
            if number in (F.INTERNED_NAMES, F.INTERNED_CATEGORIES, F.INTERNED_ANNOTATION_NAMES):
                iid, name = 0, ""
                for n, _, v in fields(_message(value, "an interned entry")):
                    if n == F.INTERNED_IID:
                        iid = int(v)
                    elif n == F.INTERNED_NAME:
                        name = _text(v)
                self.interned[(seq, number)][iid] = name

    def clock_snapshot(self, buf: memoryview) -> None:
        for number, _, value in fields(buf):
            if number == F.SNAPSHOT_CLOCKS:
                clock, ts = 0, 0
                for n, _, v in fields(_message(value, "a clock")):
                    if n == F.CLOCK_ID:
                        clock = int(v)
                    elif n == F.CLOCK_TIMESTAMP:
                        ts = int(v)
                self.snapshot[clock] = ts

    def descriptor(self, buf: memoryview) -> None:
        fields_of = list(fields(buf))
        uuid = next((int(v) for n, _, v in fields_of if n == F.TRACK_UUID), 0)
        track = self.tracks.setdefault(uuid, _Track(uuid))
        for number, _, value in fields_of:
            if number == F.TRACK_PARENT_UUID:
                track.parent = int(value)
            elif number == F.TRACK_NAME:
                track.name = _text(value)
            elif number == F.TRACK_COUNTER:
                track.is_counter = True
            elif number == F.TRACK_PROCESS:
                for n, _, v in fields(_message(value, "a process")):
                    if n == F.PROCESS_PID:
                        track.pid = as_int64(int(v))
                    elif n == F.PROCESS_NAME:
                        track.process_name = _text(v)
                    elif n == F.PROCESS_LABELS:
                        track.labels.append(_text(v))
                    elif n == F.PROCESS_LEGACY_SORT_INDEX:
                        track.sort_index = as_int64(int(v))
            elif number == F.TRACK_THREAD:
                for n, _, v in fields(_message(value, "a thread")):
                    if n == F.THREAD_PID:
                        track.pid = as_int64(int(v))
                    elif n == F.THREAD_TID:
                        track.tid = as_int64(int(v))
                    elif n == F.THREAD_NAME:
                        track.name = _text(v)
                    elif n == F.THREAD_LEGACY_SORT_INDEX:
                        track.sort_index = as_int64(int(v))

    def _event(self, seq: int, ts: int, buf: memoryview) -> None:
        kind, track, name = 0, 0, ""
        cats: list[str] = []
        args: dict[str, Any] = {}
        flows: list[tuple[int, bool]] = []
        value_counter: float | None = None
        names = self.interned[(seq, F.INTERNED_NAMES)]
        categories = self.interned[(seq, F.INTERNED_CATEGORIES)]
        keys = self.interned[(seq, F.INTERNED_ANNOTATION_NAMES)]
        for number, _, value in fields(buf):
            if number == F.EVENT_TYPE:
                kind = int(value)
            elif number == F.EVENT_TRACK_UUID:
                track = int(value)
            elif number == F.EVENT_NAME_IID:
                name = names.get(int(value), "")
            elif number == F.EVENT_NAME:
                name = _text(value)
            elif number == F.EVENT_CATEGORY_IIDS:
                cats.append(categories.get(int(value), ""))
            elif number == 22:  # categories (not interned)
                cats.append(_text(value))
            elif number == F.EVENT_DEBUG_ANNOTATIONS:
                key, val = _annotation(_message(value, "a debug annotation"), keys)
                args[key] = val
            elif number == F.EVENT_FLOW_IDS:
                flows.append((int(value), True))
            elif number == F.EVENT_TERMINATING_FLOW_IDS:
                flows.append((int(value), False))
            elif number == F.EVENT_DOUBLE_COUNTER_VALUE:
                value_counter = as_double(int(value))
            elif number == F.EVENT_COUNTER_VALUE:
                value_counter = float(as_int64(int(value)))
        if kind == F.TYPE_SLICE_END:
            stack = self.open.get(track)
            if stack:
                self.slices.append((stack.pop(), ts))
            return
        if kind == F.TYPE_COUNTER:
            if value_counter is not None:
                self.counter_samples.append((track, ts, value_counter))
            return
        item = _Event(track, ts, name, cats[0] if cats else "", args or None, flows or None, kind == F.TYPE_INSTANT)
        if kind == F.TYPE_SLICE_BEGIN:
            self.open[track].append(item)
        elif kind == F.TYPE_INSTANT:
            if name == METADATA_EVENT and self.tracks.get(track) is not None and self.tracks[track].name == METADATA_TRACK:
                self.metadata = args
            else:
                self.instants.append(item)

    # -- the model ------------------------------------------------------------------------------
    def _trace(self) -> Trace:
        meta, layout = self.meta_and_layout()
        devices, resources, row_of_track, device_of_track = self.places(layout)
        builder = ActivityBuilder()
        unclosed = [(item, None) for stack in self.open.values() for item in stack]
        rows = [(item, end) for item, end in self.slices] + [(i, i.ts) for i in self.instants] + unclosed
        rows.sort(key=lambda r: (r[0].ts, -(r[1] if r[1] is not None else r[0].ts)))
        last = max([end for _, end in rows if end is not None] + [0])
        for item, end in rows:
            track = item.track
            res = row_of_track.get(track)
            if res is None:
                res = row_of_track[track] = self.lone_row(track, devices, resources, device_of_track)
            args = dict(item.args) if item.args else {}
            ext = args.pop("External id", 0)
            corr = args.get("correlation", 0)
            kind = ActivityKind.INSTANT if item.instant else kind_from_category(item.cat)
            if end is None:  # a begin without its end: open until the trace's last time
                args["finished"], end = False, max(last, item.ts)
            row = builder.append(
                kind, item.cat, item.name, resources[res].device, res, item.ts, end,
                _int64(corr), _int64(ext), args=args or None,
            )
            for key, is_start in (item.flows or ())[:1]:
                cols = builder._cols
                cols["flow_id"][row], cols["flow_type"][row] = key >> 2, (key & 3) or FLOW_AC2G
                cols["flow_start"][row] = 1 if is_start else 0
        return self.finish(builder.freeze(), devices, resources, device_of_track, meta, layout)

    def finish(
        self, acts: Any, devices: list[Device], resources: list[Resource], device_of_track: dict[int, int],
        meta: dict[str, Any], layout: dict,
    ) -> Trace:
        """The trace of the rows `acts` placed on `devices` / `resources`: counters, clock, metadata."""
        counters = Counters()
        for track, ts, value in self.counter_samples:
            t = self.tracks.get(track)
            dev = device_of_track.get(t.parent if t else 0, 0) if devices else 0
            if not devices:
                devices.append(Device("pid:0", "unknown", 0, "process 0", pid=0))
            counters.add(t.name if t else f"counter {track}", dev, ts, value)
        from polyprof.formats.common.finish import finish_trace  # the one way a reader finishes a Trace

        epoch = layout.get("epoch_offset_ns")
        if not isinstance(epoch, int):
            epoch = self.snapshot.get(F.CLOCK_REALTIME, 0) - self.snapshot.get(F.CLOCK_MONOTONIC, 0) if self.snapshot else 0
        return finish_trace(meta, acts, devices, resources, counters, reserved=_RESERVED,
                            base_time_ns=meta.get("baseTimeNanoseconds", layout.get("base_time_ns", 0)),
                            epoch_offset_ns=int(epoch), window=layout_window(layout))

    def meta_and_layout(self) -> tuple[dict[str, Any], dict]:
        """The metadata event's values, and polyprof's layout among them ({} when there is none)."""
        meta = dict(self.metadata or {})
        return meta, meta.get(LAYOUT_KEY) if isinstance(meta.get(LAYOUT_KEY), dict) else {}

    def places(self, layout: dict) -> tuple[list[Device], list[Resource], dict[int, int], dict[int, int]]:
        """Devices and rows: from polyprof's layout when there is one, else from the descriptors."""
        devices: list[Device] = []
        resources: list[Resource] = []
        row_of_track: dict[int, int] = {}
        device_of_track: dict[int, int] = {}
        if isinstance(layout.get("devices"), list) and isinstance(layout.get("rows"), list):
            for d in layout["devices"]:
                device_of_track[int(d["track"])] = len(devices)
                devices.append(Device(str(d["key"]), str(d["type"]), int(d["index"]), str(d["name"]),
                                      sort_index=int(d["sort_index"]), pid=int(d["pid"]), label=str(d["label"])))
            for r in layout["rows"]:
                if not 0 <= int(r["device"]) < len(devices):
                    raise ValueError(f"a row names device {r['device']}, of {len(devices)}")
                row_of_track[int(r["track"])] = len(resources)
                resources.append(Resource(int(r["device"]), int(r["tid"]), str(r["name"]), int(r["sort_index"])))
            for resource, uuid in layout.get("lanes", []):
                if not 0 <= int(resource) < len(resources):
                    raise ValueError(f"a lane names row {resource}, of {len(resources)}")
                row_of_track[int(uuid)] = int(resource)
            return devices, resources, row_of_track, device_of_track
        for t in self.tracks.values():  # another writer's trace: process tracks are devices
            if t.pid is not None and t.tid is None:
                device_of_track[t.uuid] = len(devices)
                devices.append(Device(f"pid:{t.pid}", "cpu" if "CPU" in t.labels else "unknown", max(t.pid, 0),
                                      t.process_name or f"process {t.pid}", sort_index=t.sort_index, pid=t.pid,
                                      label=t.labels[0] if t.labels else ""))
        for t in self.tracks.values():
            if t.tid is not None:
                row_of_track[t.uuid] = self.lone_row(t.uuid, devices, resources, device_of_track)
        return devices, resources, row_of_track, device_of_track

    def lone_row(self, track: int, devices: list[Device], resources: list[Resource], device_of_track: dict[int, int]) -> int:
        """A row for a track that the layout does not name: under its parent process (or one made for it)."""
        t = self.tracks.get(track) or _Track(track)
        dev = device_of_track.get(t.parent)
        if dev is None and t.pid is not None:
            dev = next((i for i, d in enumerate(devices) if d.pid == t.pid), None)
        if dev is None:
            dev = len(devices)
            pid = t.pid if t.pid is not None else 0
            devices.append(Device(f"pid:{pid}:{track}", "unknown", max(pid, 0), f"process {pid}", pid=pid))
            device_of_track[t.parent or -track] = dev
        resources.append(Resource(dev, t.tid if t.tid is not None else track, t.name or f"track {track}", t.sort_index))
        return len(resources) - 1


def layout_window(layout: dict) -> tuple[int, int] | None:
    """The window polyprof's layout records, or None (another writer's trace: the rows' extent)."""
    window = layout.get("window")
    ok = isinstance(window, list) and len(window) == 2 and all(isinstance(w, int) for w in window)
    return (int(window[0]), int(window[1])) if ok else None


def _annotation(buf: memoryview, keys: dict[int, str]) -> tuple[str, Any]:
    key, value = "", None
    for number, _, v in fields(buf):
        if number == F.ANNOTATION_NAME_IID:
            key = keys.get(int(v), f"arg {int(v)}")
        elif number == F.ANNOTATION_NAME:
            key = _text(v)
        elif number == F.ANNOTATION_BOOL:
            value = bool(v)
        elif number == F.ANNOTATION_INT:
            value = as_int64(int(v))
        elif number == F.ANNOTATION_UINT:
            value = int(v)
        elif number == F.ANNOTATION_DOUBLE:
            value = as_double(int(v))
        elif number == F.ANNOTATION_STRING:
            value = _text(v)
        elif number == F.ANNOTATION_LEGACY_JSON:
            value = orjson.loads(bytes(_message(v, "a JSON value")))
    return key, value


def _int64(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63 else 0
