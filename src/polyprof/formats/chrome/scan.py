"""Large Chrome-trace JSON read into columns without a Python object per event: the C scanner
(``_native.scan_events``, _native/csrc/read_events.c) finds each event's fields in the bytes, this module
turns what it found into a :class:`Trace`.

::

    trace = scan_trace(data, "trace.json")       # None: the scanner declined, use the reference reader (read.py)
    trace = scan_file("rank0.json.gz")           # the file read 4 MB at a time, never held whole

The reader in :mod:`polyprof.formats.chrome.read` stays the reference: the scanner reads exactly what it reads
and declines (None) for anything it would read differently (a string timestamp, repeated keys, escaped
keys, a pid given as a list, a malformed or cut-off event...), so that the reader reads the file and
says what is wrong with it.
"""

from __future__ import annotations

import gzip
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson

from polyprof import _native
from polyprof._native import DECLINED
from polyprof.formats.chrome.dialect import FLOW_TYPES, apply_metadata, pid_device, tid_resource
from polyprof.formats.common.chunk import Chunk
from polyprof.formats.common.declined import Declined
from polyprof.formats.common.finish import finish_trace
from polyprof.formats.common.source import disk_position, is_gzip_file, max_value_bytes
from polyprof.formats.common.texts import named_texts
from polyprof.formats.common.values import us_to_ns
from polyprof.model import (
    FLOW_AC2G,
    ActivityKind,
    ActivityTable,
    Args,
    Counters,
)
from polyprof.model.activities import COLUMNS
from polyprof.model.args import ArgsBlock, JSONArray

ACT_DTYPE = np.dtype(
    [("ts", "<i8"), ("end", "<i8"), ("corr", "<i8"), ("ext", "<i8"), ("cat", "<i4"), ("name", "<i4"),
     ("pid", "<i4"), ("res", "<i4"), ("instant", "<i4"), ("pad", "<i4")]
)
FLOW_DTYPE = np.dtype(
    [("ts", "<i8"), ("id", "<i8"), ("prev", "<i8"), ("pid", "<i4"), ("res", "<i4"), ("cat", "<i4"), ("start", "<i4")]
)
CHUNK = 4 << 20


def _new_state() -> list[Any]:
    return [bytearray(), bytearray(), {}, {}, {}, {}, [], {}, False]


def scan_trace(data: bytes, path: str = "<trace>") -> Any:
    """The trace in `data` (plain JSON bytes), or None where the scanner declines."""
    start = -1
    for size in (1 << 16, 1 << 20, len(data)):  # the keys before the events are read, not the events
        start = _native.events_array_start(memoryview(data)[:size])
        if start != -1 or size >= len(data):
            break
    if start < 0 or data.lstrip()[:1] != b"{":
        return None  # no traceEvents key, the bare-array form or not JSON: the reader says which
    state = _new_state()
    end = _native.scan_events(data, start, True, state)
    if end == DECLINED:
        return None
    key_at = data.rfind(b'"traceEvents"', 0, start)
    top = _top_level(data[:key_at] + b'"traceEvents":[]' + data[end:])
    return None if top is None else _assembled(state, top, path)


def scan_file(path: str, max_bytes: int) -> Any:
    """The trace in the JSON file `path` (gzip or not), read in chunks; None where the scanner declines.
    Reading more than `max_bytes` (after inflation) declines too, and so does an event, or the keys
    around the events, longer than one token may be (formats/common/source.py): the reader then says which."""
    state = _new_state()
    scan = _FileScan(path, max_bytes)
    try:
        for _ in scan.buffers(state):
            pass
    except Declined:
        return None
    top = scan.top(final=True)
    return None if top is None else _assembled(state, top, path)


def scan_chunks(path: str, rows: int, on_read: Callable[[int], None] | None = None) -> Iterator[Chunk]:
    """The JSON trace `path` (gzip or not) as partial traces of about `rows` rows each (a 4 MB read at
    a time, as :func:`scan_file`), sharing their devices and rows (polyprof.formats.chrome.read's
    ``read_chunks`` says what chunks are); the last chunk has the file's keys after its events too.
    Raises Declined where the scanner declines, chunks yielded or not: read the file again with the
    reference reader's chunks. `on_read` is told the file's bytes read (on disk) as chunks are made."""
    state = _new_state()
    scan = _FileScan(path, 1 << 62)
    places = _ScanPlaces()
    pending = None
    for _ in scan.buffers(state):
        if len(state[0]) >= rows * ACT_DTYPE.itemsize:
            if on_read is not None:
                on_read(scan.position)
            chunk = _chunk(state, scan.top(final=False), path, places, pending)
            if pending is not None:
                yield Chunk(pending)
            pending = chunk
    if on_read is not None:
        on_read(scan.position)
    last = _chunk(state, scan.top(final=True), path, places, pending)
    if pending is not None:
        yield Chunk(pending)
    yield Chunk(last)


class _FileScan:
    """A JSON trace file scanned 4 MB at a time into a scanner state; its head (the bytes before the
    events) and tail (after them) kept for the top-level keys."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.head = self.tail = b""
        self.position = 0  # the file's bytes read, on disk

    def buffers(self, state: list[Any]) -> Iterator[None]:
        """Scans the file into `state`, yielding after each read; Declined where the scanner declines."""
        opener = gzip.open if is_gzip_file(self.path) else open
        held = max_value_bytes() + CHUNK  # the most left unscanned at once
        total = 0
        with opener(self.path, "rb") as f:
            buf = bytearray()
            pos = -1
            while True:
                block = f.read(CHUNK)
                total += len(block)
                self.position = disk_position(f)
                if total > self.max_bytes or len(buf) > held:
                    raise Declined
                final = not block
                buf += block
                if pos < 0:
                    pos = _native.events_array_start(buf) if buf.lstrip()[:1] == b"{" else -2
                    if pos == -1 and not final:
                        continue
                    if pos < 0:
                        raise Declined
                    self.head = bytes(buf[: buf.rfind(b'"traceEvents"', 0, pos)])
                end = _native.scan_events(buf, pos, final, state)
                if end == DECLINED:
                    raise Declined
                if state[8]:
                    self.tail = bytes(buf[end:]) + f.read(max(0, held + 1 - (len(buf) - end)))
                    if total + len(self.tail) > self.max_bytes or len(self.tail) > held:
                        raise Declined
                    return
                yield
                del buf[:end]
                pos = 0
                if final:
                    raise Declined

    def top(self, final: bool) -> dict[str, Any] | None:
        """The top-level keys: those before the events, and after them once the scan is `final`."""
        return _top_level(self.head + b'"traceEvents":[]' + (self.tail if final else b"}"))


class _ScanPlaces:
    """The devices, rows and decoded strings of a file read in chunks, kept from chunk to chunk (the
    scanner's codes index them)."""

    def __init__(self) -> None:
        self.devices: list[Any] = []
        self.resources: list[Any] = []
        self.texts: list[str] = []

    def update(self, state: list[Any]) -> None:
        strings, pids, threads = state[2], state[3], state[4]
        for n, token in enumerate(itertools.islice(pids, len(self.devices), None), len(self.devices)):
            self.devices.append(pid_device(_decode(token), n))
        for n, key in enumerate(itertools.islice(threads, len(self.resources), None), len(self.resources)):
            self.resources.append(tid_resource(int.from_bytes(key[:4], "little", signed=True), _decode(key[4:]), n))
        for token in itertools.islice(strings, len(self.texts), None):
            value = _decode(token)
            self.texts.append(value if isinstance(value, str) else str(value))


def _chunk(state: list[Any], top: dict[str, Any] | None, path: str, places: _ScanPlaces, before: Any) -> Any:
    """The rows scanned since the last chunk as a trace, the state then emptied of them; a flow event
    at the chunk's head goes onto `before`'s last row where it belongs there (see _place_flows)."""
    if top is None:
        raise Declined
    places.update(state)
    if before is not None:
        _flows_onto_last_row(state, before, places.texts)
    trace = _assembled(state, top, path, places)
    if trace is None:
        raise Declined
    state[0], state[1], state[5], state[6] = bytearray(), bytearray(), {}, []
    return trace


def _flows_onto_last_row(state: list[Any], before: Any, texts: list[str]) -> None:
    flows = np.frombuffer(state[1], dtype=FLOW_DTYPE)
    acts = before.activities
    last = len(acts) - 1
    lead = np.flatnonzero((flows["prev"] < 0) & (flows["id"] > 0))
    if last < 0 or not len(lead):
        return
    taken = np.zeros(len(flows), dtype=bool)
    for i in lead.tolist():
        if acts["start"][last] == flows["ts"][i] and acts["device"][last] == flows["pid"][i]:
            cat = int(flows["cat"][i])
            acts["flow_id"][last] = flows["id"][i]
            acts["flow_type"][last] = FLOW_TYPES.get(texts[cat], FLOW_AC2G) if cat >= 0 else FLOW_AC2G
            acts["flow_start"][last] = flows["start"][i] != 0
            taken[i] = True
    state[1] = bytearray(flows[~taken].tobytes())


def _assembled(state: list[Any], top: dict[str, Any], path: str, places: _ScanPlaces | None = None) -> Any:
    """The trace, or None where a token the scanner passed on does not decode (not UTF-8, not JSON) or
    anything else surprises: the reader then reads the file and names the problem."""
    try:
        if places is None:
            places = _ScanPlaces()
            places.update(state)
        return _assemble(state, top, path, places)
    except Exception:  # noqa: BLE001 - the reference reader gives the error, with its event
        return None


def _top_level(doc: bytes) -> dict[str, Any] | None:
    try:
        top = orjson.loads(doc)
    except orjson.JSONDecodeError:
        return None
    return top if isinstance(top, dict) else None


def _decode(token: bytes) -> Any:
    return orjson.loads(token)


def _assemble(state: list[Any], top: dict[str, Any], path: str, places: _ScanPlaces) -> Any:
    acts_raw, flows_raw, strings, pids, threads, blocks, others, flow_threads, _ = state
    recs = np.frombuffer(acts_raw, dtype=ACT_DTYPE)
    flows = np.frombuffer(flows_raw, dtype=FLOW_DTYPE)
    devices, resources, texts = places.devices, places.resources, places.texts  # in code order, as read
    counters = Counters()
    for what, dev, res, raw in others:
        ev = orjson.loads(raw)
        args = ev.get("args") or {}
        if not isinstance(args, dict):
            raise Declined  # the reader names the event
        if what == 0:
            apply_metadata(ev.get("name"), args, devices[dev], resources[res] if res >= 0 else None)
            continue
        ts = us_to_ns(ev.get("ts"), path, "a counter")
        for key, value in args.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                name = str(ev.get("name", key)) if len(args) == 1 else f"{ev.get('name', '')}.{key}"
                counters.add(name, dev, ts, float(value))
    table, codes, kind_of_cat = named_texts(texts, recs["cat"], recs["name"])
    n = len(recs)
    columns = {name: np.zeros(n, dtype=dtype) for name, dtype in COLUMNS}
    columns["kind"][:] = np.where(recs["instant"] != 0, int(ActivityKind.INSTANT), kind_of_cat[recs["cat"]])
    columns["cat"][:] = codes[recs["cat"]]
    columns["name"][:] = codes[recs["name"]]
    columns["device"][:] = recs["pid"]
    columns["resource"][:] = recs["res"]
    columns["start"][:] = recs["ts"]
    columns["end"][:] = recs["end"]
    columns["correlation"][:] = recs["corr"]
    columns["external_id"][:] = recs["ext"]
    # the flows' threads as the rows' (-1: no row on that thread)
    flow_res = np.array([threads.get(key, -1) for key in flow_threads] or [-1], dtype=np.int32)
    _place_flows(columns, flows, flow_res, texts)
    args = Args()
    for signature, (rows_raw, values) in blocks.items():
        keys = tuple(_decode(b'"' + k + b'"') for k in signature.split(b"\x00")[:-1])
        rows = np.frombuffer(rows_raw, dtype=np.int64)
        args.blocks.append(ArgsBlock(rows, keys, [JSONArray.of(v, len(v)) for v in values]))
    acts = ActivityTable(table, columns, args)
    return finish_trace(top, acts, devices, resources, counters)


def _last_rows_at(resource: np.ndarray, start: np.ndarray, res: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """For each (res[i], ts[i]), the last row on that row-resource starting at that time (-1: none, or
    res[i] < 0): the pairs as one int64 key each, found by binary search in the rows' sorted keys."""
    resource, res = resource.astype(np.int64), res.astype(np.int64)
    if not len(resource):
        return np.full(len(res), -1, dtype=np.int64)
    lo = min(int(start.min()), int(ts.min()))
    span = max(int(start.max()), int(ts.max())) - lo + 1
    if (int(resource.max()) + 1) * span >= 1 << 62:  # keys would not fit: pair by pair
        last = {(r, t): i for i, (r, t) in enumerate(zip(resource.tolist(), start.tolist(), strict=True))}
        return np.array([last.get((r, t), -1) if r >= 0 else -1 for r, t in zip(res.tolist(), ts.tolist(), strict=True)],
                        dtype=np.int64)
    keys = resource * span + (start - lo)
    order = np.argsort(keys, kind="stable")  # among equal keys the last row comes last
    ordered = keys[order]
    wanted = np.maximum(res, 0) * span + (ts - lo)
    at = np.searchsorted(ordered, wanted, side="right") - 1
    found = (at >= 0) & (ordered[np.maximum(at, 0)] == wanted) & (res >= 0)
    return np.where(found, order[np.maximum(at, 0)], -1)


def _place_flows(columns: dict[str, np.ndarray], flows: np.ndarray, flow_res: np.ndarray, texts: list[str]) -> None:
    """Each flow event onto its activity: the row just before it when that row starts at the flow's
    time on the flow's pid (Kineto writes a flow right after its activity), else the last row at the
    same (pid, tid, ts); later flows on a row win, as in the reader's loop."""
    flows = flows[flows["id"] > 0]
    if not len(flows):
        return
    start, device = columns["start"], columns["device"]
    prev = flows["prev"]
    ok = prev >= 0
    at = np.maximum(prev, 0)
    row = np.where(ok & (start[at] == flows["ts"]) & (device[at] == flows["pid"]), prev, -1)
    missing = np.flatnonzero(row < 0)
    if len(missing):
        row[missing] = _last_rows_at(columns["resource"], start, flow_res[flows["res"][missing]], flows["ts"][missing])
    kept = row >= 0
    flows, row = flows[kept], row[kept]
    if not len(row):
        return
    types = np.array([FLOW_TYPES.get(t, FLOW_AC2G) for t in texts] + [FLOW_AC2G], dtype=np.int8)
    # the last flow event of each row wins: keep, per row, its last occurrence
    by_row = np.argsort(row, kind="stable")
    grouped = row[by_row]
    last_of_row = by_row[np.concatenate((grouped[1:] != grouped[:-1], [True]))]
    flows, row = flows[last_of_row], row[last_of_row]
    columns["flow_id"][row] = flows["id"]
    columns["flow_type"][row] = types[flows["cat"]]  # cat -1 (absent): the last entry, ac2g
    columns["flow_start"][row] = flows["start"] != 0

