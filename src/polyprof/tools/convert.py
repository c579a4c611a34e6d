"""``polyprof convert IN OUT``: traces users already have, in the other format.

::

    from polyprof.tools.convert import convert
    stats = convert("rank0.pt.trace.json.gz", "rank0.pftrace")   # Kineto/torch.profiler JSON -> Perfetto
    convert("rank0.pftrace", "rank0.json.gz")                      # and back

JSON to Perfetto streams, so that a trace too large to open converts without loading the document:
events are parsed one at a time by ijson's C backend (yajl2_c), each event's name, category and args
are encoded at once and appended to a temporary file, and only five numbers per event stay in memory
(start, end, row, where its encoding is, its length). Then the rows' slices are ordered and spread
over lanes (:mod:`polyprof.formats.perfetto.order`) and the packets written, each event's encoding read
back from the temporary file. The top-level keys around ``traceEvents`` (deviceProperties,
distributedInfo, baseTimeNanoseconds...) are read from the head and the tail of the file. Every other
direction (Perfetto to JSON, JSON to JSON) reads the trace into the model and writes it.
"""

from __future__ import annotations

import array
import io
import os
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from polyprof import progress
from polyprof.errors import ConfigError, TraceFormatError
from polyprof.formats.chrome.dialect import ENVELOPE_PIDS, FLOW_TYPES, Places, metadata_row
from polyprof.formats.chrome.keys import top_level_keys
from polyprof.formats.chrome.read import json_events
from polyprof.formats.common.paths import check_output_path, format_of, trace_output
from polyprof.formats.common.source import open_stream
from polyprof.formats.common.values import hashable, us_to_ns
from polyprof.formats.files import write_trace
from polyprof.formats.perfetto import write as W
from polyprof.formats.perfetto.order import slice_events
from polyprof.formats.perfetto.read import is_perfetto_file
from polyprof.formats.perfetto.tracks import Tracks
from polyprof.model import FLOW_AC2G, Counters, Trace


@dataclass
class ConvertStats:
    """What a conversion read and wrote."""

    events: int = 0  # slices and instants written
    flows: int = 0
    counters: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # events not written, by why
    input_bytes: int = 0
    output: str = ""


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, format: str | None = None) -> ConvertStats:
    """Convert the trace file `src` into `dst` (its format from its suffix, or `format`)."""
    src, dst = os.fspath(src), check_output_path(dst)
    if os.path.abspath(src) == dst:
        raise ConfigError(f"convert {src}: the output is the input; give another file name")
    out_format = format_of(dst, format)
    if out_format == "perfetto" and not is_perfetto_file(src):
        return _json_to_perfetto(src, dst)
    from polyprof.formats.files import load_trace

    trace = load_trace(src)
    written = write_trace(trace, dst, out_format)
    flows = int(np.count_nonzero(trace.activities["flow_id"])) if len(trace.activities) else 0
    return ConvertStats(len(trace.activities), flows, len(trace.counters), {}, os.path.getsize(src), written)


class _Columns:
    """The few numbers kept per event while the JSON streams by (typed arrays: no object per event)."""

    NAMES = ("start", "end", "row", "offset", "length", "instant", "name", "cat", "flow_key", "flow_start")
    CODES = ("q", "q", "i", "q", "i", "b", "i", "i", "q", "b")

    def __init__(self) -> None:
        for name, code in zip(self.NAMES, self.CODES, strict=True):
            setattr(self, name, array.array(code))

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.frombuffer(getattr(self, name), dtype=np.dtype(code)) if len(getattr(self, name)) else
                np.zeros(0, dtype=np.dtype(code)) for name, code in zip(self.NAMES, self.CODES, strict=True)}


def _ts(value: Any, src: str, n: int, what: str = "") -> int:
    if type(value) is float and -4e15 < value < 4e15:  # the usual case, without _ns's checks
        return int(round(value * 1000))
    return us_to_ns(value, src, f"traceEvents[{n}]{what}")


def _json_to_perfetto(src: str, dst: str) -> ConvertStats:
    stats = ConvertStats(input_bytes=os.path.getsize(src), output=dst)
    top = top_level_keys(src)
    with tempfile.TemporaryFile(dir=os.path.dirname(dst), buffering=0) as bodies, open_stream(src) as stream:
        gathered = _Gathered(src, bodies)
        gathered.read(stream, stats.input_bytes)
        stats.skipped, stats.flows, stats.counters = gathered.skipped, gathered.flows, gathered.counter_values
        cols = gathered.columns.arrays()
        gathered.columns = _Columns()  # the typed arrays go; only their numpy views stay
        trace = _trace_of(top, gathered, cols)
        stats.events = len(cols["start"])
        with trace_output(dst) as out:
            _write_packets(out, trace, gathered.interned, gathered.names, gathered.cats, bodies.fileno(), cols,
                           gathered.loose)
    return stats


class _Gathered:
    """What the JSON's events leave for the Perfetto writer, read one event at a time.

    Slices and instants become a row of :class:`_Columns` (their args encoded at once into `bodies`);
    flows join the slice read just before them on the same thread and time, or wait in `loose`;
    counters and the places (processes, threads and their names) are kept as the model keeps them.
    """

    def __init__(self, src: str, bodies: IO[bytes]) -> None:
        self.src = src
        self.places, self.counters, self.interned = Places(), Counters(), W.Interned()
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.columns = _Columns()
        self.loose: list[tuple[int, int, int, int]] = []  # flows not right after their event: (row, ts, key, start)
        self.skipped: dict[str, int] = {}
        self.rows: dict[tuple[Any, Any], int] = {}
        self.flows = self.counter_values = 0
        self.buffered = io.BufferedWriter(bodies, buffer_size=1 << 20)  # type: ignore[arg-type]
        self.written = 0
        self.last: tuple[Any, Any, int] | None = None  # (pid, tid, ts) of the slice just read

    def read(self, stream: Any, total_bytes: int) -> None:
        """Every event of `stream`; a broken document or event is one TraceFormatError naming it."""
        src, n = self.src, 0
        bare = (stream.peek(64)[:64] if hasattr(stream, "peek") else b"").lstrip().startswith(b"[")
        raw = getattr(stream, "fileobj", None) or stream  # the file under gzip: its position is the progress
        advance, read_so_far = progress.task("converted bytes", total=total_bytes), 0
        try:
            for n, ev in enumerate(json_events(stream, bare)):  # noqa: B007 - n names the event in errors
                if not n & 0xFFFF:
                    position = raw.tell()
                    advance(position - read_so_far)
                    read_so_far = position
                if not isinstance(ev, dict):
                    raise TraceFormatError(f"{src}: traceEvents[{n}] is not an object")
                ph, pid, tid = ev.get("ph"), hashable(ev.get("pid")), hashable(ev.get("tid"))
                envelope = ev.get("cat") == "Trace" or pid in ENVELOPE_PIDS or ev.get("s") == "g"
                if ph in ("X", "i", "I") and not envelope:
                    self.slice(ev, n, ph, pid, tid)
                elif ph in ("s", "f", "t"):
                    self.flow(ev, n, ph, pid, tid)
                elif ph == "M":
                    ev["pid"], ev["tid"] = pid, tid
                    places = self.places
                    metadata_row(ev, places.devices, places.resources, places.device, places.resource)
                elif ph == "C":
                    self.counter(ev, n, pid)
                else:
                    self.skip("Kineto's envelope and global markers" if envelope else f"phase {str(ph)[:8]!r}")
        except TraceFormatError:
            raise
        except Exception as exc:  # the JSON itself is broken, or an event is malformed: one line
            why = " ".join(str(exc).split())[:120]  # the parser's message can span lines
            raise TraceFormatError(f"{src}: traceEvents[{n}] cannot be read ({type(exc).__name__}: {why})") from None
        self.buffered.flush()

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def slice(self, ev: dict, n: int, ph: str, pid: Any, tid: Any) -> None:
        c, src = self.columns, self.src
        ts = _ts(ev.get("ts"), src, n)
        dur = _ts(ev.get("dur", 0), src, n, " dur") if ph == "X" else 0
        args = ev.get("args")
        c.offset.append(self.written)
        if args:
            if not isinstance(args, dict):
                raise TraceFormatError(f"{src}: traceEvents[{n}] has args that are not an object")
            body = W.annotations(args, self.interned)
            self.buffered.write(body)
            c.length.append(len(body))
            self.written += len(body)
        else:
            c.length.append(0)
        row = self.rows.get((pid, tid))
        if row is None:
            row = self.rows[(pid, tid)] = self.places.resource(self.places.device(pid), tid)
        name, cat = ev.get("name", ""), ev.get("cat", "")
        c.name.append(self.names.setdefault(name if type(name) is str else str(name), len(self.names) + 1))
        c.cat.append(self.cats.setdefault(cat if type(cat) is str else str(cat), len(self.cats) + 1))
        c.start.append(ts)
        c.end.append(ts + max(0, dur))
        c.row.append(row)
        c.instant.append(0 if ph == "X" else 1)
        c.flow_key.append(0)
        c.flow_start.append(0)
        self.last = (pid, tid, ts)

    def flow(self, ev: dict, n: int, ph: str, pid: Any, tid: Any) -> None:
        fid = ev.get("id")
        if not isinstance(fid, int) or isinstance(fid, bool) or not 0 < fid < 2**61:
            self.skip("flows without a usable id")
            return
        key = fid * 4 + FLOW_TYPES.get(str(ev.get("cat", "ac2g")), FLOW_AC2G)
        ts = _ts(ev.get("ts"), self.src, n)
        c = self.columns
        if self.last is not None and self.last == (pid, tid, ts) and c.flow_key[-1] == 0:
            c.flow_key[-1], c.flow_start[-1] = key, 1 if ph == "s" else 0
        else:
            self.loose.append((self.places.resource(self.places.device(pid), tid), ts, key, ph == "s"))
        self.flows += 1

    def counter(self, ev: dict, n: int, pid: Any) -> None:
        args = ev.get("args") or {}
        ts = _ts(ev.get("ts"), self.src, n)
        for k, value in (args.items() if isinstance(args, dict) else ()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                name = str(ev.get("name", k)) if len(args) == 1 else f"{ev.get('name', '')}.{k}"
                self.counters.add(name, self.places.device(pid), ts, float(value))
                self.counter_values += 1


def _trace_of(top: dict[str, Any], gathered: _Gathered, cols: dict[str, np.ndarray]) -> Trace:
    """The model's trace around the gathered columns: places, counters and the top-level keys."""
    base = top.get("baseTimeNanoseconds", 0)
    base = base if isinstance(base, int) else 0
    properties = top.get("deviceProperties")
    return Trace(
        devices=gathered.places.devices, resources=gathered.places.resources, counters=gathered.counters,
        metadata={k: v for k, v in top.items() if k not in ("traceEvents", "deviceProperties", "schemaVersion",
                                                                "displayTimeUnit", "baseTimeNanoseconds", "traceName")},
        device_properties=[p for p in properties if isinstance(p, dict)] if isinstance(properties, list) else [],
        epoch_offset_ns=base, base_time_ns=base,
        window=(int(cols["start"].min()), int(cols["end"].max())) if len(cols["start"]) else (0, 0),
    )


def _bodies(fd: int, offset: np.ndarray, length: np.ndarray) -> list[bytes | None]:
    """The encoded args of rows (ascending file offsets), read back from the temporary file."""
    out: list[bytes | None] = [None] * len(offset)
    has = np.flatnonzero(length > 0)
    if not len(has):
        return out
    lo, hi = int(offset[has[0]]), int(offset[has[-1]] + length[has[-1]])
    if hi - lo <= 64 << 20:  # nearby: one read
        block = os.pread(fd, hi - lo, lo)
        for i, o, n in zip(has.tolist(), (offset[has] - lo).tolist(), length[has].tolist(), strict=True):
            out[i] = block[o : o + n]
    else:
        for i, o, n in zip(has.tolist(), offset[has].tolist(), length[has].tolist(), strict=True):
            out[i] = os.pread(fd, n, o)
    return out


def _write_packets(out: IO[bytes], trace: Trace, interned: Any, names: dict, cats: dict, fd: int,
                   c: dict[str, np.ndarray], loose: list) -> None:
    start, end, row_of = c["start"], c["end"], c["row"].astype(np.int64)
    tracks = Tracks(trace)
    out.write(W.header(trace, [(i, s) for s, i in names.items()], [(i, s) for s, i in cats.items()]))
    out.write(tracks.descriptors())
    flow_key, flow_start = c["flow_key"].copy(), c["flow_start"].copy()
    if loose and len(start):  # a flow event away from its slice: the slice that starts there on its row
        by_place = np.lexsort((start, row_of))
        lo = int(start.min())
        keys = row_of[by_place] * (1 << 40) + start[by_place] - lo
        for res, ts, key, is_start in loose:
            p = int(np.searchsorted(keys, res * (1 << 40) + ts - lo))
            if p < len(keys) and keys[p] == res * (1 << 40) + ts - lo and flow_key[by_place[p]] == 0:
                flow_key[by_place[p]], flow_start[by_place[p]] = key, is_start
    events, lane = slice_events(row_of, start, end, c["instant"])
    track = np.array(tracks.resource_uuid or [0], dtype=np.int64)[row_of] if len(start) else np.zeros(0, np.int64)
    over = np.flatnonzero(lane > 0)
    keys, which = np.unique((row_of[over] << 32) | lane[over], return_inverse=True)
    lanes = [(k >> 32, k & 0xFFFFFFFF) for k in keys.tolist()]
    track[over] = np.array([tracks.lane(r, k) for r, k in lanes], dtype=np.int64)[which] if lanes else 0
    out.write(tracks.lane_descriptors(lanes))
    pending = interned.take_new()
    if pending:
        out.write(W.interned_packet(pending))
    columns = (track, start, np.maximum(end, start), c["name"], c["cat"], flow_key, flow_start)
    for lo in range(0, len(events), W.CHUNK_EVENTS):
        chunk = events[lo : lo + W.CHUNK_EVENTS]
        rows, local = np.unique(chunk >> 2, return_inverse=True)
        blobs = _bodies(fd, c["offset"][rows], c["length"][rows])
        t, s, e, nm, ct, fk, fs = (np.ascontiguousarray(col[rows], dtype=np.int64) for col in columns)
        none = np.zeros(len(rows), dtype=np.int64)  # External id and correlation are in the args
        local_events = (local.astype(np.int64) << 2) | (chunk & 3)
        out.write(W.encode_events((local_events, (t, s, e, nm, ct, none, none, none, fk, fs), blobs, 0, 0)))
    out.write(W.counter_packets(trace, tracks))
    meta = W.metadata_packet(trace, tracks, interned)
    out.write(W.interned_packet(interned.take_new()) + meta)
