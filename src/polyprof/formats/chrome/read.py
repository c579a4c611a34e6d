"""The reference reader of Kineto-dialect Chrome traces (written by polyprof or torch.profiler): JSON
parsed by orjson, each event read in Python. The C scanner's reader (:mod:`.scan`) reads exactly what
this one reads, or declines; :func:`polyprof.formats.load_trace` chooses.

::

    trace = parse_json(data, "trace.json")      # bytes, not compressed
    trace = scanned_file("trace.json.gz", limit) # the C scanner, or None

A file that is truncated, not JSON or not a trace raises :class:`polyprof.errors.TraceFormatError`
with a one-line message naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import ijson
import orjson

from polyprof.errors import TraceFormatError
from polyprof.formats.chrome import scan as chrome_scan
from polyprof.formats.chrome.dialect import ENVELOPE_PIDS, FLOW_TYPES, Places, metadata_row
from polyprof.formats.common.chunk import Chunk, falling_back
from polyprof.formats.common.finish import Where, finish_trace
from polyprof.formats.common.source import TokenBound, is_gzip_file, max_trace_bytes, trace_chunks
from polyprof.formats.common.values import hashable, us_to_ns
from polyprof.model import (
    FLOW_AC2G,
    ActivityBuilder,
    ActivityKind,
    Counters,
    Device,
    Trace,
    kind_from_category,
)

#: bytes the token check has ijson read at a time: its C backend re-reads a token that spans reads from
#: its start at each read, so a long one costs about (its length / this)^2. Refusing a 96 MiB string:
#: 14.5 s at ijson's 64 KiB, 3.5-3.8 s here; checking a 100 MB trace: 3.3-4.2 s against 4.0-4.1 s.
#: (Reading events stays at 64 KiB: 1 MiB made it slower, 11.4-12.9 s against 9.6 s for 100 MB.)
TOKEN_CHECK_READ = 256 << 10


def check_tokens(chunks: Any, path: str) -> None:
    """Refuse (TraceFormatError) gzip JSON holding one token longer than the token limit, reading it as a
    stream that holds at most that limit: what it inflates to is not known before, and a small gzip
    can hold one string of gigabytes. (Parsing the whole stream with ijson instead holds only the events,
    but took 2.1x the time and 1.3x the memory of orjson over the inflated bytes: ijson's dicts do not
    share their keys. This pass takes about what orjson's parse takes.)"""
    source = TokenBound(chunks, path)
    try:
        read = min(TOKEN_CHECK_READ, source.max_value)  # (a token over the limit is seen within one read)
        for _ in source.tokens(ijson.basic_parse(source, use_float=True, buf_size=read)):
            pass
    except ijson.JSONError as exc:
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        problem = "is truncated" if "premature" in said else "is not valid JSON"
        raise TraceFormatError(f"{path}: {problem} ({said})") from None


def json_events(stream: Any, bare: bool) -> Any:
    """The events of a JSON trace streamed one at a time (ijson's C backend): `bare` for the array form."""
    return ijson.items(stream, "item" if bare else "traceEvents.item", use_float=True)


def scanned_file(path: str, limit: int) -> Trace | None:
    """The JSON trace at `path` read by the C scanner (formats/chrome/scan.py), or None: not built, not a
    plain JSON trace file, or something the scanner leaves to the reader (which then says what is wrong)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return chrome_scan.scan_file(path, limit)
    except (OSError, EOFError, zlib.error, chrome_scan.Declined):
        return None


def parse_json(data: bytes, path: str = "<trace>") -> Trace:
    """The trace in `data`, Chrome JSON not compressed (`path` names it in errors): the C scanner's reading
    where it takes it, else the reference reader's."""
    if not data.strip():
        raise TraceFormatError(f"{path}: the file is empty")
    try:
        scanned = chrome_scan.scan_trace(data, path)
    except chrome_scan.Declined:
        scanned = None
    if scanned is not None:
        return scanned
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        problem = (
            "is truncated"
            if "unexpected end" in str(exc).lower() or "eof" in str(exc).lower()
            else "is not valid JSON"
        )
        raise TraceFormatError(f"{path}: {problem} ({exc})") from None
    return trace_of_doc(doc, path)


def read_streamed(path: str) -> Trace:
    """The trace at `path` (JSON, gzip or not) read by the reference reader one event at a time (ijson's
    C backend), the other top-level keys from the file's head and tail: memory holds the trace being
    built, not the file's bytes nor every event's dict at once (about 2x the time of reading it whole).
    For large files the C scanner declines or cannot read (no extension)."""
    with _streamed_events(path) as (keys, events, _):
        return trace_of_doc({**keys, "traceEvents": events}, path)


@contextlib.contextmanager
def _streamed_events(path: str) -> Iterator[tuple[dict[str, Any], Iterator[Any], Any]]:
    """The file's top-level keys (from its head and tail), its events as ijson streams them, and the
    stream; ijson's error while the block reads them is the TraceFormatError that names it."""
    from polyprof.formats.chrome.keys import top_level_keys
    from polyprof.formats.common.source import open_stream

    keys = top_level_keys(path)
    with open_stream(path) as stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        try:
            yield keys, json_events(stream, head.lstrip().startswith(b"[")), stream
        except ijson.JSONError as exc:
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            problem = "is truncated" if "premature" in said or "incomplete" in said else "is not valid JSON"
            raise TraceFormatError(f"{path}: {problem} ({said})") from None


def json_chunks(path: str, rows: int, on_read: Callable[[int], None] | None = None) -> Iterator[Chunk]:
    """The JSON trace at `path` (gzip or not) as chunks of about `rows` rows: the C scanner's
    (:func:`.scan.scan_chunks`), or where it declines, this reader's (:func:`read_chunks`) from the
    file's start, a gzip file's tokens checked first as :func:`polyprof.formats.load_trace` checks them."""

    def reference() -> Iterator[Chunk]:
        if is_gzip_file(path):  # one token of gigabytes (a gzip bomb) is refused before reading
            check_tokens(trace_chunks(path, max_trace_bytes()), path)
        return read_chunks(path, rows, on_read)

    return falling_back(lambda: chrome_scan.scan_chunks(path, rows, on_read), reference)


def read_chunks(path: str, events_per_chunk: int, on_read: Callable[[int], None] | None = None) -> Iterator[Chunk]:
    """The trace at `path` (JSON, gzip or not) as partial traces of about `events_per_chunk` events each,
    read one event at a time: memory holds one chunk, whatever the file's size. The chunks share their
    devices and rows (a row's index means the same thread in every chunk; the names the file gives them
    are final after the last chunk) and each has the file's top-level keys. A chunk ends after the flow
    events that follow its last activity (where Kineto writes them); a flow event far from its activity
    is joined only within its chunk. `on_read` is told the file's bytes read (on disk) before each
    chunk is yielded."""
    from polyprof.formats.common.source import disk_position

    places = Places()
    with _streamed_events(path) as (keys, events, stream):
        first = 0
        for chunk in _event_chunks(events, events_per_chunk):
            if on_read is not None:
                on_read(disk_position(stream))
            yield Chunk(trace_of_doc({**keys, "traceEvents": chunk}, path, places, first))
            first += len(chunk)


def _event_chunks(events: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """`events` in lists of `size`, each list extended by the flow events right after its last."""
    chunk: list[Any] = []
    for ev in events:
        if len(chunk) >= size and not (isinstance(ev, dict) and ev.get("ph") in ("s", "f", "t")):
            yield chunk
            chunk = []
        chunk.append(ev)
    yield chunk


def trace_of_doc(doc: Any, path: str, places: Places | None = None, first: int = 0) -> Trace:
    """The trace of a parsed JSON document (the object form, or the bare array of events); its events
    may be an iterator, read once. A chunk of a file's events gives the file's `places` so far and the
    index of its `first` event (for the errors)."""
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if events is None or isinstance(events, (str, bytes, dict)) or not hasattr(events, "__iter__"):
        raise TraceFormatError(f"{path}: JSON but not a Chrome trace (no traceEvents list)")
    where = Where()
    try:
        return _build(doc, path, where, places, first)
    except TraceFormatError:
        raise
    except Exception as exc:  # any other structural surprise: one line, never a traceback
        raise TraceFormatError(f"{path}: {where.what} is malformed ({type(exc).__name__}: {str(exc)[:120]})") from None


def _build(doc: dict[str, Any], path: str, where: Where, places: Places | None = None, first: int = 0) -> Trace:
    places = places or Places()
    devices, resources, device, resource = places.devices, places.resources, places.device, places.resource

    builder = ActivityBuilder()
    counters = Counters()
    at_position: dict[tuple[Any, Any, int], int] = {}
    pending_flows: list[tuple[dict, int, int]] = []  # (event, ts, row of the X event just before it)
    last_row = -1
    events = doc["traceEvents"]
    for n, ev in enumerate(events, first):
        where.what = f"traceEvents[{n}]"
        if not isinstance(ev, dict):
            raise TraceFormatError(f"{path}: traceEvents[{n}] is not an object")
        if "pid" in ev:
            ev["pid"] = hashable(ev["pid"])
        if "tid" in ev:
            ev["tid"] = hashable(ev["tid"])
        ph = ev.get("ph")
        if ev.get("cat") == "Trace" or ev.get("pid") in ENVELOPE_PIDS:
            continue  # Kineto's envelope ("PyTorch Profiler (0)" on "Spans"): the profile, not an activity
        if ph == "M":
            metadata_row(ev, devices, resources, device, resource)
            continue
        if ph not in ("X", "i", "I", "C", "s", "f", "t"):
            continue
        pid, tid = ev.get("pid"), ev.get("tid")
        if ph == "i" and ev.get("s") == "g":
            continue  # "Record Window End" and other global markers
        ts = us_to_ns(ev.get("ts"), path, f"traceEvents[{n}]")
        dev = device(pid)
        if ph == "C":
            _add_counter(counters, ev, dev, ts, f"{path}: traceEvents[{n}]")
            continue
        if ph in ("s", "f", "t"):
            pending_flows.append((ev, ts, last_row))
            continue
        cat = str(ev.get("cat", ""))
        res = resource(dev, tid)
        raw_args = ev.get("args") or {}
        if not isinstance(raw_args, dict):
            raise TraceFormatError(f"{path}: traceEvents[{n}] has args that are not an object")
        args = dict(raw_args)
        ext = args.pop("External id", 0)
        corr = args.get("correlation", 0)
        if ph == "X":
            kind = kind_from_category(cat)
            dur = us_to_ns(ev.get("dur", 0), path, f"traceEvents[{n}] dur")
        else:
            kind, dur = ActivityKind.INSTANT, 0
        row = builder.append(
            kind,
            cat,
            str(ev.get("name", "")),
            dev,
            res,
            ts,
            ts + max(0, dur),
            corr if isinstance(corr, int) and not isinstance(corr, bool) and -(2**63) <= corr < 2**63 else 0,
            ext if isinstance(ext, int) and not isinstance(ext, bool) and -(2**63) <= ext < 2**63 else 0,
            args=args or None,
        )
        at_position[(pid, tid, ts)] = row
        last_row = row
    _attach_flows(builder._cols, pending_flows, at_position, devices)
    return finish_trace(doc, builder.freeze(), devices, resources, counters, where)


def _add_counter(counters: Counters, ev: dict, dev: int, ts: int, where: str) -> None:
    """A ``C`` event's numeric args: one counter value each (named by the event alone when it has one)."""
    args = ev.get("args") or {}
    if not isinstance(args, dict):
        raise TraceFormatError(f"{where} (a counter) has args that are not an object")
    for key, value in args.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            name = str(ev.get("name", key)) if len(args) == 1 else f"{ev.get('name', '')}.{key}"
            counters.add(name, dev, ts, float(value))


def _attach_flows(cols: dict[str, Any], pending_flows: list[tuple[dict, int, int]],
                  at_position: dict[tuple[Any, Any, int], int], devices: list[Device]) -> None:
    """Each flow event onto its activity's row: the row read just before it when at the same time and
    process (Kineto writes a flow right after its activity), else the one at the same thread and time."""
    positions = (cols["device"], cols["resource"], cols["start"])
    for ev, ts, previous in pending_flows:
        row = (
            previous
            if previous >= 0 and positions[2][previous] == ts and _same_pid(previous, ev, devices, positions)
            else None
        )
        if row is None:
            row = at_position.get((ev.get("pid"), ev.get("tid"), ts))
        fid = ev.get("id")
        if row is None or not isinstance(fid, int) or isinstance(fid, bool) or not 0 < fid < 2**63:
            continue
        cols["flow_id"][row] = fid
        cols["flow_type"][row] = FLOW_TYPES.get(str(ev.get("cat", "ac2g")), FLOW_AC2G)
        cols["flow_start"][row] = 1 if ev.get("ph") == "s" else 0


def _same_pid(row: int, ev: dict, devices: list[Device], positions: tuple) -> bool:
    return devices[positions[0][row]].key == f"pid:{ev.get('pid')}"


