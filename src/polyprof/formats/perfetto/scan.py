"""Large Perfetto protobuf traces read into columns without a Python object per event: the C scanner
(``_native.scan_packets``, _native/csrc/read_packets.c) walks the packets, this module turns what it found
into a :class:`Trace`.

::

    trace = scan_perfetto(data, "trace.pftrace")   # None: the scanner declined, use io.perfetto's reader

The reader in :mod:`polyprof.formats.perfetto.read` stays the reference: the scanner reads exactly what it reads
(track descriptors and clock snapshots go through the reader's own parsers) and declines (None) for
anything it would read differently, so that the reader reads the file and says what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from polyprof import _native
from polyprof.formats.common.declined import Declined
from polyprof.formats.common.texts import named_texts
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto.write import METADATA_EVENT, METADATA_TRACK
from polyprof.model import FLOW_AC2G, ActivityKind, ActivityTable, Args, StringTable
from polyprof.model.activities import COLUMNS
from polyprof.model.args import ArgsBlock, JSONArray

#: _native/csrc/read_packets.c's pf_rec
PF_DTYPE = np.dtype(
    [("ts", "<i8"), ("end", "<i8"), ("track", "<u8"), ("ext", "<i8"), ("corr", "<i8"), ("flow", "<u8"),
     ("value", "<f8"), ("name", "<i4"), ("cat", "<i4"), ("end_order", "<i4"), ("open_slot", "<i4"),
     ("type", "i1"), ("has_flow", "i1"), ("flow_start", "i1"), ("has_ext_key", "i1"), ("has_value", "i1"),
     ("pad", "V3")]
)
assert PF_DTYPE.itemsize == 80


def scan_perfetto(data: bytes, path: str = "<trace>", *, metadata_only: bool = False) -> Any:
    """The trace in the Perfetto protobuf bytes `data`, or None where the scanner declines. With
    `metadata_only`, the trace without its events (its metadata, places, clock and window), or None
    where the window is not recorded (it would take the events)."""
    return _trace_of(_native.scan_packets(data, metadata_only), path, metadata_only)


def scan_perfetto_pieces(pieces: Iterable[bytes], path: str = "<trace>", *, metadata_only: bool = False) -> Any:
    """:func:`scan_perfetto` for the trace's bytes in pieces (a file read in steps), of which the scanner
    holds only a packet cut off at a piece's end: a large file's scan holds its columns, not its bytes.

    ::

        trace = scan_perfetto_pieces(trace_chunks(path, limit), path)   # None: declined
    """
    return _trace_of(scan_pieces(pieces, metadata_only), path, metadata_only)


def scan_pieces(pieces: Iterable[bytes], metadata_only: bool = False, tolerate_torn: bool = False) -> Any:
    """What the scanner finds in the trace's bytes fed in pieces (``_native.scan_packets``' tuple), or
    None where it declines. With `tolerate_torn`, a last packet cut off is left out (see
    :func:`scan_torn`)."""
    scanner = _fed(pieces, metadata_only, tolerate_torn)
    return None if scanner is None else _native.scan_packets_result(scanner)


def scan_torn(pieces: Iterable[bytes], path: str) -> tuple[Any, tuple[int, int, int]] | None:
    """The trace of a Perfetto spill's bytes fed in pieces, a last packet cut off by the kill left out
    as ``PacketReader(tolerate_torn=True)`` leaves it, and (packets, packet sequences, bytes left out);
    None where the scanner declines (the reader then reads it and names what is wrong)."""
    scanner = _fed(pieces, False, True)
    if scanner is None:
        return None
    counts = _native.scan_packets_counts(scanner)
    trace = _trace_of(_native.scan_packets_result(scanner), path, False)
    return None if trace is None else (trace, counts)


def _fed(pieces: Iterable[bytes], metadata_only: bool, tolerate_torn: bool) -> Any:
    """A packet scanner fed every piece, or None where it declines (or is not built)."""
    scanner = _native.packet_scanner(metadata_only, tolerate_torn)
    if scanner is None:
        return None
    for piece in pieces:
        if _native.scan_packets_feed(scanner, piece) < 0:
            return None
    return scanner


def _trace_of(found: Any, path: str, metadata_only: bool) -> Any:
    if found is None:
        return None
    try:
        return _assemble(found, path, metadata_only)
    except Exception:  # noqa: BLE001 - the reference reader gives the error, with its packet
        return None


def _assemble(found: tuple, path: str, metadata_only: bool = False) -> Any:
    reader, recs, texts, args_of, meta_rows = scanned_head(found, path)
    meta, layout = reader.meta_and_layout()
    if metadata_only:
        if not isinstance(layout.get("window"), list):
            return None
        devices, resources, _, device_of_track = reader.places(layout)
        none = ActivityTable(StringTable(), {name: np.zeros(0, dtype=dtype) for name, dtype in COLUMNS}, Args())
        return reader.finish(none, devices, resources, device_of_track, meta, layout)
    rows, ends = row_order(recs, meta_rows)
    return rows_trace(reader, Places(*reader.places(layout), meta, layout), recs, rows, ends, texts, args_of)


def check_legacy(legacy: list[bytes]) -> None:
    """The legacy JSON values the scanner passed on as text are JSON (else the reader names the event)."""
    for text in set(legacy):
        orjson.loads(text)


def scanned_head(found: tuple, path: str) -> tuple[Any, np.ndarray, list[str], ArgsOf, np.ndarray]:
    """What the scanner found (``scan_packets``' tuple), read: the reference reader holding the tracks,
    the clock and the metadata event (the last one, as the reader keeps), for its places and its finish;
    the records, the strings, their annotations and which records are the metadata event."""
    from polyprof.formats.perfetto.read import PacketReader

    raw, strings, descriptors, snapshots, blocks, legacy = found
    check_legacy(legacy)
    texts = [b.decode() for b in strings]
    recs = np.frombuffer(raw, dtype=PF_DTYPE)
    args_of = ArgsOf(blocks, texts)
    meta_rows = metadata_rows(recs, texts, descriptors, path)
    reader = PacketReader(path)
    for snapshot in snapshots:
        reader.clock_snapshot(memoryview(snapshot))
    reader.metadata = args_of.dict_at(int(meta_rows[-1])) if len(meta_rows) else None
    for _, descriptor in descriptors:
        reader.descriptor(memoryview(descriptor))
    return reader, recs, texts, args_of, meta_rows


@dataclass
class Places:
    """The devices and rows of a trace (``PacketReader.places``), with its metadata and layout: what a
    trace read in chunks keeps from chunk to chunk (a track without a row gets one the first time)."""

    devices: list
    resources: list
    row_of_track: dict[int, int]
    device_of_track: dict[int, int]
    meta: dict[str, Any]
    layout: dict


def rows_trace(reader: Any, places: Places, recs: np.ndarray, rows: np.ndarray, ends: np.ndarray, texts: list[str],
               args_of: ArgsOf) -> Any:
    """The trace of the records `rows` of `recs` (ending at `ends`), with the counter values among `recs`."""
    kind = recs["type"]
    reader.counter_samples = [
        (int(t), int(ts), float(v)) for t, ts, v in recs[["track", "ts", "value"]][kind == F.TYPE_COUNTER].tolist()
    ]
    devices, resources, row_of_track = places.devices, places.resources, places.row_of_track
    tracks = recs["track"][rows]
    unique, first, inverse = np.unique(tracks, return_index=True, return_inverse=True)
    for i in np.argsort(first, kind="stable").tolist():  # rows for unnamed tracks, as the reader meets them
        t = int(unique[i])
        if t not in row_of_track:
            row_of_track[t] = reader.lone_row(t, devices, resources, places.device_of_track)
    res_of_track = np.array([row_of_track[int(t)] for t in unique.tolist()] or [0], dtype=np.int32)
    resource = res_of_track[inverse.reshape(-1)] if len(rows) else np.zeros(0, dtype=np.int32)
    device_of_res = np.array([r.device for r in resources] or [0], dtype=np.int32)
    r = _Gathered(recs, rows)
    cats, names = r["cat"], r["name"]
    table, codes, kind_of_cat = named_texts(texts, cats, names)
    columns = {name: np.zeros(len(rows), dtype=dtype) for name, dtype in COLUMNS}
    columns["kind"][:] = np.where(r["type"] == F.TYPE_INSTANT, int(ActivityKind.INSTANT), kind_of_cat[cats])
    columns["cat"][:] = codes[cats]
    columns["name"][:] = codes[names]
    columns["resource"][:] = resource
    columns["device"][:] = device_of_res[resource]
    columns["start"][:] = r["ts"]
    columns["end"][:] = ends
    columns["correlation"][:] = r["corr"]
    columns["external_id"][:] = r["ext"]
    flow = r["has_flow"] != 0
    key = r["flow"][flow]
    columns["flow_id"][flow] = (key >> np.uint64(2)).astype(np.int64)
    flow_type = (key & np.uint64(3)).astype(np.int8)
    columns["flow_type"][flow] = np.where(flow_type != 0, flow_type, FLOW_AC2G)
    columns["flow_start"][flow] = r["flow_start"][flow]
    args = args_of.placed(rows)
    for row in np.flatnonzero((r["type"] == F.TYPE_SLICE_BEGIN) & (r["end_order"] < 0)).tolist():
        args.dicts[row] = {"finished": False}  # a begin without its end: open until the trace's last time
    acts = ActivityTable(table, columns, args)
    return reader.finish(acts, devices, resources, places.device_of_track, places.meta, places.layout)


def metadata_rows(recs: np.ndarray, texts: list[str], descriptors: list, path: str) -> np.ndarray:
    """The records of polyprof's metadata event: an instant of that name on a track the descriptors
    read before it name as the metadata track."""
    from polyprof.formats.perfetto.read import PacketReader

    try:
        name = texts.index(METADATA_EVENT)
    except ValueError:
        return np.zeros(0, dtype=np.int64)
    candidates = np.flatnonzero((recs["type"] == F.TYPE_INSTANT) & (recs["name"] == name))
    kept = []
    for i in candidates.tolist():
        names = PacketReader(path)
        for before, descriptor in descriptors:
            if before > i:
                break
            names.descriptor(memoryview(descriptor))
        track = names.tracks.get(int(recs["track"][i]))
        if track is not None and track.name == METADATA_TRACK:
            if recs["has_ext_key"][i]:
                raise Declined  # the reader keeps that key in the metadata; rows lose it
            kept.append(i)
    return np.array(kept, dtype=np.int64)


def row_order(recs: np.ndarray, meta_rows: np.ndarray, floor: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The records that are rows, in the reader's order (by start, then longest first; ties: slices in
    the order they ended, instants, then slices still open by track), and each row's end (a slice
    still open: the last end among the records, or `floor` where that is later)."""
    kind = recs["type"]
    index = np.arange(len(recs), dtype=np.int64)
    instant = kind == F.TYPE_INSTANT
    instant[meta_rows] = False
    begin = kind == F.TYPE_SLICE_BEGIN
    closed = begin & (recs["end_order"] >= 0)
    unclosed = begin & ~closed
    ts, end = recs["ts"], recs["end"]
    done = closed | instant
    last = max(int(end[done].max()) if done.any() else 0, floor, 0)
    group = np.where(closed, 0, np.where(instant, 1, 2))
    first_key = np.where(closed, recs["end_order"], np.where(instant, index, recs["open_slot"]))
    sort_end = np.where(unclosed, ts, end)
    rows = np.flatnonzero(done | unclosed)
    order = np.lexsort((index[rows], first_key[rows], group[rows], -sort_end[rows], ts[rows]))
    rows = rows[order]
    ends = np.where(unclosed[rows], np.maximum(ts[rows], last), end[rows])
    return rows, ends


class _Gathered:
    """The records `rows` of `recs`, a field at a time (a copy of whole 80-byte records would be the
    largest thing a large trace's read holds)."""

    def __init__(self, recs: np.ndarray, rows: np.ndarray) -> None:
        self.recs, self.rows = recs, rows

    def __getitem__(self, field: str) -> np.ndarray:
        return self.recs[field][self.rows]


class ArgsOf:
    """The scanner's annotation blocks (by record), placed on rows or read for one record."""

    def __init__(self, blocks: dict, texts: list[str]) -> None:
        self.blocks = []
        for signature, (rows_raw, values) in blocks.items():
            keys = tuple(texts[k] for k in np.frombuffer(signature, dtype=np.int32).tolist())
            rows = np.frombuffer(rows_raw, dtype=np.int64)
            self.blocks.append((rows, keys, [JSONArray.of(v, len(v)) for v in values]))

    def dict_at(self, record: int) -> dict[str, Any]:
        for rows, keys, columns in self.blocks:
            p = int(np.searchsorted(rows, record))
            if p < len(rows) and rows[p] == record:
                return {k: orjson.loads(c[p]) for k, c in zip(keys, columns, strict=True)}
        return {}

    def placed(self, rows: np.ndarray) -> Args:
        """Args of the rows: row i is record rows[i]."""
        position = np.full(int(rows.max()) + 1 if len(rows) else 0, -1, dtype=np.int64)
        position[rows] = np.arange(len(rows), dtype=np.int64)
        args = Args()
        for records, keys, columns in self.blocks:
            new = np.full(len(records), -1, dtype=np.int64)
            inside = records < len(position)
            new[inside] = position[records[inside]]
            kept = np.flatnonzero(new >= 0)
            if not len(kept):
                continue
            order = kept[np.argsort(new[kept], kind="stable")]
            args.blocks.append(ArgsBlock(new[order], keys, [c[order] for c in columns]))
        return args
