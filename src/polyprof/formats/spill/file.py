"""The spill: what a profile has completed, appended to a file while it records, so that a process
killed without warning (SIGKILL, an OOM kill, ``os._exit``, a power cut) still leaves a trace behind.

A spill is a file header line and checksummed chunks, each self-describing::

    POLYPROF-SPILL 1\\n
    chunk: b"PPSC" | kind (1 byte) | payload length (uint64 LE) | crc32 of the payload (uint32 LE) | payload

Kinds: ``H`` the profile (JSON: clock, argv, pid, activities), ``W`` a recording window's start or,
once its backends have handed everything over, its end (JSON), ``P`` one sealed part (a backend's rows
of one flush or collect: a JSON header, then the raw column bytes), ``E`` the clean end. Reading stops at the first chunk that is torn or fails its checksum (the process died
writing it), and everything before it is kept::

    writer = SpillWriter.create(path, header)      # 0600, never following a planted name
    writer.append_part(part)
    chunks = read_spill(path)                      # .header, .windows, .parts, .ended, .torn_bytes
"""

from __future__ import annotations

import io
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import numpy as np
import orjson

from polyprof.errors import TraceFormatError
from polyprof.formats.common.jsonsafe import json_bytes
from polyprof.formats.common.paths import new_private_file
from polyprof.formats.spill.names import FILE_MAGIC, PERFETTO_SPILL_SUFFIX
from polyprof.model import (
    COLUMNS,
    COUNTER_COLUMNS,
    HOST_TIME_LIMIT_NS,
    ActivityKind,
    ActivityTable,
    Args,
    BackendStatus,
    CollectedPart,
    Counters,
    Device,
    Resource,
    StringTable,
)
from polyprof.model.args import ArgsBlock, is_json_column

CHUNK_MAGIC = b"PPSC"
_CHUNK_HEAD = struct.Struct("<4scQI")
HEADER, WINDOW, PART, END = b"H", b"W", b"P", b"E"
_NO_ROWS = np.zeros(0, dtype=np.int64)


class SpillFile:
    """What every spill does: created exclusively (0600, a planted name or symlink never followed),
    appended under one lock (the flush thread and the engine both write), a clean close that waits for
    the collects of windows that ended. Subclasses say how parts, windows and the end are written."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._file = os.fdopen(fd, "ab", buffering=0)
        self._lock = threading.Lock()
        self.bytes = 0
        self.rows = 0
        self._awaiting = 0  # windows that ended and whose collected rows are still to come
        self._close_asked = False

    @classmethod
    def _open(cls, path: str) -> int:
        """A new file at `path` (see :func:`~polyprof.formats.common.paths.new_private_file`)."""
        return new_private_file(path)

    def _write(self, data: bytes, rows: int = 0) -> None:
        """Append `data` durably (a chunk that is written survives a power cut)."""
        with self._lock:
            if self._file.closed:
                return
            self._file.write(data)
            os.fsync(self._file.fileno())
            self.bytes += len(data)
            self.rows += rows

    def append_parts(self, parts: list[CollectedPart]) -> None:
        raise NotImplementedError

    def append_window(self, info: dict[str, Any]) -> None:
        raise NotImplementedError

    def _end_marker(self) -> bytes:
        return b""

    def window_ended(self) -> None:
        """A window's collect is on its way (the background writer): a clean close waits for it."""
        with self._lock:
            self._awaiting += 1

    def window_collected(self, parts: list[CollectedPart], info: dict[str, Any]) -> None:
        """The rows a window's collect brought that no flush had spilled, and the window's end."""
        self.append_parts(parts)
        self.append_window(info)
        with self._lock:
            self._awaiting -= 1
            close_now = self._awaiting <= 0 and self._close_asked
        if close_now:
            self.close(clean=True)

    def close(self, clean: bool = True, remove: bool = False) -> None:
        """End the spill (with its end marker when `clean`); a clean close without `remove` waits for
        the collects of windows that ended (:meth:`window_ended`)."""
        with self._lock:
            if self._file.closed:
                return
            if clean and not remove and self._awaiting > 0:
                self._close_asked = True
                return
            if clean:
                self._file.write(self._end_marker())
            self._file.close()
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class SpillWriter(SpillFile):
    """polyprof's spill format (see the module docstring)."""

    @classmethod
    def create(cls, path: str, header: dict[str, Any]) -> SpillWriter:
        writer = cls(path, cls._open(path))
        writer._write(FILE_MAGIC)
        writer.append(HEADER, json_bytes(header))
        return writer

    def append(self, kind: bytes, payload: bytes, rows: int = 0) -> None:
        self._write(_CHUNK_HEAD.pack(CHUNK_MAGIC, kind, len(payload), zlib.crc32(payload)) + payload, rows)

    def append_window(self, info: dict[str, Any]) -> None:
        self.append(WINDOW, json_bytes(info))

    def append_part(self, part: CollectedPart) -> None:
        if len(part.activities) or len(part.counters):
            self.append(PART, encode_part(part), len(part.activities))

    def append_parts(self, parts: list[CollectedPart]) -> None:
        for part in parts:
            self.append_part(part)

    def _end_marker(self) -> bytes:
        return _CHUNK_HEAD.pack(CHUNK_MAGIC, END, 0, zlib.crc32(b""))


def spill_path(output: str) -> str:
    """Where the spill of a trace written to `output` lives: a hidden file beside it; for a Perfetto
    output a Perfetto trace itself (``.t.spill.pftrace``, see :mod:`polyprof.formats.spill.perfetto`)."""
    from polyprof.formats.common.paths import format_of

    folder, name = os.path.split(os.path.abspath(output))
    if format_of(output) == "perfetto":
        stem = name[:-3] if name.endswith(".gz") else name
        return os.path.join(folder, f".{os.path.splitext(stem)[0]}{PERFETTO_SPILL_SUFFIX}")
    return os.path.join(folder, f".{name}.spill")


# -- parts <-> bytes ---------------------------------------------------------------------------------
def encode_part(part: CollectedPart) -> bytes:
    """A sealed part as a JSON header and the raw bytes of its columns."""
    arrays: list[np.ndarray] = []

    def ref(a: np.ndarray) -> list:
        a = np.ascontiguousarray(a)
        arrays.append(a)
        return [a.dtype.str, len(a)]

    acts = part.activities
    blocks = []
    for b in acts.args.blocks:
        rows = ref(b.rows)  # before its columns: decode_part takes the arrays in this order
        cols = []
        for c in b.columns:
            if is_json_column(c):
                cols.append({"json": [v.decode("utf-8", "replace") if isinstance(v, bytes) else "" for v in c.tolist()]})
            elif c.dtype.kind in "iufb":
                cols.append({"array": ref(c)})
            else:
                cols.append({"values": orjson.loads(json_bytes(c.tolist()))})
        blocks.append({"rows": rows, "keys": list(b.keys), "columns": cols})
    counters = part.counters.columns
    head = {
        "backend": part.backend,
        "status": part.status.to_json(),
        "context_scoped": part.context_scoped,
        "devices": [asdict(d) for d in part.devices],
        "resources": [asdict(r) for r in part.resources],
        "strings": list(acts.strings.strings),
        "columns": {name: ref(acts.columns[name]) for name, _ in COLUMNS},
        "dict_args": [[row, a] for row, a in acts.args.dicts.items()],
        "blocks": blocks,
        "counter_strings": list(part.counters.strings.strings),
        "counters": {name: ref(counters[name]) for name, _ in COUNTER_COLUMNS},
        "metadata": dict(part.metadata),
        "device_properties": list(part.device_properties),
    }
    header = json_bytes(head)
    return struct.pack("<Q", len(header)) + header + b"".join(a.tobytes() for a in arrays)


def decode_part(payload: bytes, args: bool = True) -> CollectedPart:
    """The part `encode_part` wrote (without its args where `args` is false: a quarter of the time)."""
    (size,) = struct.unpack_from("<Q", payload)
    head = orjson.loads(payload[8 : 8 + size])
    offset = 8 + size

    def take(spec: list, keep: bool = True) -> np.ndarray:
        nonlocal offset
        dtype, n = np.dtype(spec[0]), int(spec[1])
        if n < 0 or dtype.hasobject:
            raise ValueError(f"a column spec {spec!r} is not a count of plain values")
        nbytes = dtype.itemsize * n
        if offset + nbytes > len(payload):
            raise ValueError("a column runs past its chunk")
        a = np.frombuffer(payload, dtype=dtype, count=n, offset=offset).copy() if keep else _NO_ROWS
        offset += nbytes
        return a

    # arrays are stored in the order encode_part referenced them: blocks' first, then columns, counters
    blocks = []
    for b in head["blocks"]:
        rows = take(b["rows"], args)
        cols: list[np.ndarray] = []
        for c in b["columns"]:
            if "array" in c:
                cols.append(take(c["array"], args))
            elif "json" in c and args:
                from polyprof.model.args import JSONArray

                cols.append(JSONArray.of(map(str.encode, c["json"]), len(c["json"])))
            elif args:
                cols.append(np.array(c["values"] + [None], dtype=object)[:-1])
        if args:
            blocks.append(ArgsBlock(rows, tuple(b["keys"]), cols))
    columns = {name: take(head["columns"][name]) for name, _ in COLUMNS}
    counter_columns = {name: take(head["counters"][name]) for name, _ in COUNTER_COLUMNS}
    strings = StringTable()
    for s in head["strings"]:
        strings.intern(s)
    counter_strings = StringTable()
    for s in head["counter_strings"]:
        counter_strings.intern(s)
    args_of = Args({int(r): a for r, a in head["dict_args"]}, blocks) if args else Args()
    status = BackendStatus.from_json(head["backend"], head["status"])
    part = CollectedPart(
        backend=head["backend"],
        status=status,
        activities=ActivityTable(strings, columns, args_of),
        devices=tuple(Device(**d) for d in head["devices"]),
        resources=tuple(Resource(**r) for r in head["resources"]),
        counters=Counters.from_columns(counter_strings, counter_columns),
        metadata=head["metadata"],
        device_properties=tuple(head["device_properties"]),
        context_scoped=bool(head["context_scoped"]),
    )
    check_part(part)
    return part


def check_part(part: CollectedPart) -> None:
    """Everything the merge will index or trust in a part read back from a file, checked: a checksum
    says the bytes are the ones written, not that they were written by polyprof (a tampered spill can
    carry a valid checksum). ValueError naming the first thing wrong."""
    if not isinstance(part.backend, str):
        raise ValueError(f"the backend's name is {part.backend!r}, not a string")
    acts = part.activities
    n = _check_columns("activity", acts.columns, COLUMNS)
    devices, resources = len(part.devices), len(part.resources)
    for d in part.devices:
        _check_fields("a device", d, {"key": str, "type": str, "index": int, "name": str, "properties": dict,
                                       "sort_index": int, "pid": int, "label": str})
    for r in part.resources:
        _check_fields("a resource", r, {"device": int, "id": int, "name": str, "sort_index": int})
        if not 0 <= r.device < devices:
            raise ValueError(f"a resource's device {r.device} is not one of the part's {devices} devices")
    cols = acts.columns
    _within("name", cols["name"], len(acts.strings))
    _within("cat", cols["cat"], len(acts.strings))
    _within("device", cols["device"], devices)
    _within("resource", cols["resource"], resources)
    _within("kind", cols["kind"], int(max(ActivityKind)) + 1)
    _within("flow_type", cols["flow_type"], 3)
    if (cols["end"] < cols["start"]).any() or (cols["start"] < -HOST_TIME_LIMIT_NS).any() or (cols["end"] > HOST_TIME_LIMIT_NS).any():
        raise ValueError("a row ends before it starts, or its time is beyond HOST_TIME_LIMIT_NS")
    if not all(isinstance(s, str) for s in acts.strings.strings):
        raise ValueError("a name or category is not a string")
    for block in acts.args.blocks:
        _within("an args block's row", block.rows, n)
        if any(len(c) != len(block.rows) for c in block.columns) or not all(isinstance(k, str) for k in block.keys):
            raise ValueError("an args block's columns do not match its rows, or a key is not a string")
    if any(not (isinstance(r, int) and 0 <= r < n) or not isinstance(a, dict) for r, a in acts.args.dicts.items()):
        raise ValueError("a row's args are not a dict of a row of the part")
    counters = part.counters.columns
    _check_columns("counter", counters, COUNTER_COLUMNS)
    _within("a counter's name", counters["name"], len(part.counters.strings))
    _within("a counter's device", counters["device"], devices)
    _within("a counter's resource", counters["resource"], resources, low=-1)
    if (np.abs(counters["ts"]) > HOST_TIME_LIMIT_NS).any():
        raise ValueError("a counter sample's time is beyond HOST_TIME_LIMIT_NS")
    if not isinstance(part.metadata, dict) or not all(isinstance(p, dict) for p in part.device_properties):
        raise ValueError("the part's metadata is not a dict, or its device properties not dicts")


def _check_columns(what: str, columns: dict[str, np.ndarray], spec: tuple) -> int:
    lengths = set()
    for name, dtype in spec:
        column = columns[name]
        if column.ndim != 1 or column.dtype != np.dtype(dtype):
            raise ValueError(f"the {what} column {name} is {column.dtype}, not {np.dtype(dtype)}")
        lengths.add(len(column))
    if len(lengths) > 1:
        raise ValueError(f"the {what} columns have different lengths {sorted(lengths)}")
    return lengths.pop() if lengths else 0


def _within(what: str, values: np.ndarray, count: int, low: int = 0) -> None:
    bad = (values < low) | (values >= count)
    if bad.any():
        raise ValueError(f"{what} index {int(values[bad][0])} is outside 0..{count - 1}")


def _check_fields(what: str, obj: Any, types: dict[str, type]) -> None:
    for name, kind in types.items():
        value = getattr(obj, name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{what}'s {name} is {value!r}, not {kind.__name__}")


# -- reading -----------------------------------------------------------------------------------------
@dataclass
class Spill:
    """What a spill holds, up to the first torn chunk; chunks that passed their checksum but could not be
    used are left out and named in `dropped`."""

    header: dict[str, Any] = field(default_factory=dict)
    windows: list[dict[str, Any]] = field(default_factory=list)
    parts: list[CollectedPart] = field(default_factory=list)
    ended: bool = False
    torn_bytes: int = 0  # bytes after the last good chunk (a write the process did not finish)
    chunks: int = 0
    dropped: list[str] = field(default_factory=list)


#: the header's fields and their types (bool is not an int here); a field of another type is dropped
HEADER_FIELDS: dict[str, tuple[type, ...]] = {
    "version": (str,), "pid": (int,), "host_name": (str,), "argv": (list,), "activities": (list,),
    "epoch_offset_ns": (int,), "flush_interval_s": (int, float, type(None)), "metadata": (dict,),
}
#: a window entry's fields: the start's or the end's
WINDOW_FIELDS: dict[str, tuple[type, ...]] = {
    "window_start": (int,), "window_end": (int,), "step": (int,), "backends": (list,), "flushing": (list,),
    "collected": (list,),
}


def _chunks(f: BinaryIO, size: int, path: str) -> Iterator[tuple[bytes, bytes, int]]:
    """(kind, payload, the offset after it) of each good chunk of the spill open as `f` (`size` bytes)."""
    if f.read(len(FILE_MAGIC)) != FILE_MAGIC:
        raise TraceFormatError(f"{path}: not a polyprof spill (it does not start with {FILE_MAGIC!r})")
    at = len(FILE_MAGIC)
    while at + _CHUNK_HEAD.size <= size:
        magic, kind, length, crc = _CHUNK_HEAD.unpack(f.read(_CHUNK_HEAD.size))
        if magic != CHUNK_MAGIC or length > size - at - _CHUNK_HEAD.size:
            return
        payload = f.read(length)
        if len(payload) != length or zlib.crc32(payload) != crc:
            return
        at += _CHUNK_HEAD.size + length
        yield kind, payload, at


def _checked(doc: Any, fields: dict[str, tuple[type, ...]], what: str, dropped: list[str]) -> dict[str, Any]:
    """`doc` (a JSON object) without the fields of the wrong type (each named in `dropped`); lists of
    names keep only their strings."""
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is {type(doc).__name__}, not a JSON object")
    out = dict(doc)
    for name, kinds in fields.items():
        if name not in out:
            continue
        value = out[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            dropped.append(f"{what}: {name} {str(value)[:40]!r} is not {'/'.join(k.__name__ for k in kinds)}")
            del out[name]
        elif isinstance(value, list) and name != "argv":
            out[name] = [v for v in value if isinstance(v, str)]
    return out


def read_spill(path: str, data: bytes | None = None,
               on_part: Callable[[CollectedPart, int, int], None] | None = None) -> Spill:
    """Every good chunk of the spill at `path` (or in `data`; a TraceFormatError when it is not one). A
    chunk that passed its checksum but cannot be used (a tampered file) is left out and named in
    ``dropped``. With `on_part`, the parts are not kept: each is handed, without its args, to
    ``on_part(part, offset, length)`` (where its payload lies in the file, for :func:`read_part`) as it
    is read, and the file is read a chunk at a time."""
    if data is None and on_part is None:
        from polyprof.formats.common.source import max_trace_bytes, read_bytes

        data = read_bytes(path, max_trace_bytes())
    if data is not None:
        return _read_spill(io.BytesIO(data), len(data), path, on_part)
    with open(path, "rb") as f:
        return _read_spill(f, os.fstat(f.fileno()).st_size, path, on_part)


def read_part(f: BinaryIO, offset: int, length: int) -> CollectedPart:
    """The part whose payload `read_spill` handed over at `offset` (`length` bytes) of the spill open as
    `f`."""
    f.seek(offset)
    return decode_part(f.read(length))


def _read_spill(f: BinaryIO, size: int, path: str, on_part: Callable[[CollectedPart, int, int], None] | None
                ) -> Spill:
    spill = Spill()
    end = len(FILE_MAGIC)
    names = {HEADER: "the header", WINDOW: "a window", PART: "a part", END: "the end"}
    from polyprof import progress

    advance, done = progress.task("spill bytes read", total=size), end
    for kind, payload, end in _chunks(f, size, path):  # noqa: B007 - `end` is read after the loop
        advance(end - done)
        done = end
        spill.chunks += 1
        part = None
        try:
            if kind == HEADER:
                spill.header = _checked(orjson.loads(payload), HEADER_FIELDS, "the header", spill.dropped)
            elif kind == WINDOW:
                spill.windows.append(_checked(orjson.loads(payload), WINDOW_FIELDS, "a window", spill.dropped))
            elif kind == PART:
                part = decode_part(payload, args=on_part is None)
            elif kind == END:
                spill.ended = True
            else:
                raise ValueError(f"unknown chunk kind {kind!r}")
        except Exception as exc:  # its checksum matched, yet it cannot be used: left out, and said
            spill.dropped.append(f"chunk {spill.chunks} ({names.get(kind, repr(kind))}): {type(exc).__name__}: "
                                 f"{str(exc)[:120]}")
        if part is not None and on_part is not None:
            on_part(part, end - len(payload), len(payload))
        elif part is not None:
            spill.parts.append(part)
    spill.torn_bytes = size - end
    if not spill.header:
        raise TraceFormatError(f"{path}: the spill has no readable header"
                               + (f" ({spill.dropped[0]})" if spill.dropped else ""))
    return spill
