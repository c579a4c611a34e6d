"""The rows a crash left: what each thread had recorded (spans, instants; the torch observer's
operators) since the last hand-over, written at a fatal signal into ``SPILL.crash`` beside a flight
recorder's spill (``_native/csrc/recorder.c``, "The crash dump", gives the layout). ``polyprof recover SPILL``
reads it with the spill::

    crash = read_crash(open("flight/flight-rank0.spill.crash", "rb").read())
    crash.at_ns, [len(t.rows) for t in crash.threads], [len(t.ops) for t in crash.op_threads]
    parts = crash_parts(crash, statuses)      # the host's and torch's rows, for the merge

A file cut short (the process died while writing it) gives the threads read whole before the cut. A
crash file is data another process wrote: rows whose type is not one the recorder writes are dropped
and counted (``Crash.dropped``), and names are looked up only within their table.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from polyprof._native import COUNTER, GC, INSTANT, SPAN
from polyprof.model import ActivityKind, BackendStatus, CollectedPart
from polyprof.plugin.sink import Sink

MAGIC = b"PPCRASH1"
#: the crash file's name: the spill's, with this added
CRASH_SUFFIX = ".crash"
#: a row's fields: type, start, end, id, parent, name code (-1: its name was not written)
ROW_FIELDS = 6
UNNAMED = "<name not written at the crash>"
#: the row types the recorder writes (the host backend's: spans, instants, counters, GC pauses)
ROW_TYPES = np.array([SPAN, INSTANT, COUNTER, GC], dtype=np.int64)


@dataclass
class CrashedThread:
    tid: int
    rows: np.ndarray  # (n, ROW_FIELDS) int64
    names: list[str]
    open_spans: list[tuple[str, None, int, int, int]]  # (name, args, start, id, parent)


@dataclass
class CrashedOps:
    tid: int
    ops: np.ndarray  # (n, 3) int64: start, end (0: still open), name id (-1: not written)
    names: list[str]


@dataclass
class Crash:
    at_ns: int = 0
    threads: list[CrashedThread] = field(default_factory=list)
    op_threads: list[CrashedOps] = field(default_factory=list)
    whole: bool = False  # the end marker was reached
    dropped: int = 0  # rows of a type the recorder does not write (a damaged file)

    @property
    def rows(self) -> int:
        return sum(len(t.rows) + len(t.open_spans) for t in self.threads) + sum(len(t.ops) for t in self.op_threads)


class _Cut(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise _Cut
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def i64(self) -> int:
        return struct.unpack("<q", self.take(8))[0]

    def text(self) -> str:
        (n,) = struct.unpack("<I", self.take(4))
        return self.take(n).decode("utf-8", "replace")


def read_crash(data: bytes) -> Crash | None:
    """The crash file's threads (None: not a crash file, or empty: no crash happened)."""
    if not data.startswith(MAGIC):
        return None
    reader = _Reader(data)
    reader.take(len(MAGIC))
    crash = Crash()
    try:
        crash.at_ns = reader.i64()
        while (marker := reader.i64()) in (1, 2):
            if marker == 1:
                thread = _thread(reader)
                valid = np.isin(thread.rows[:, 0], ROW_TYPES)
                if not valid.all():
                    crash.dropped += int((~valid).sum())
                    thread.rows = thread.rows[valid]
                crash.threads.append(thread)
            else:
                tid, n_ops, n_names = reader.i64(), reader.i64(), reader.i64()
                ops = np.frombuffer(reader.take(n_ops * 3 * 8), dtype="<i8").reshape(n_ops, 3).astype(np.int64)
                crash.op_threads.append(CrashedOps(tid, ops, [reader.text() for _ in range(n_names)]))
        crash.whole = marker == 0
    except _Cut:
        pass
    return crash


def _thread(reader: _Reader) -> CrashedThread:
    tid, n_rows, n_names, n_open = (reader.i64() for _ in range(4))
    rows = np.frombuffer(reader.take(n_rows * ROW_FIELDS * 8), dtype="<i8").reshape(n_rows, ROW_FIELDS)
    names = [reader.text() for _ in range(n_names)]
    open_spans = []
    for _ in range(n_open):
        start, ident, parent = reader.i64(), reader.i64(), reader.i64()
        open_spans.append((reader.text(), None, start, ident, parent))
    return CrashedThread(tid, rows.astype(np.int64), names, open_spans)


def crash_parts(crash: Crash, statuses: dict[str, BackendStatus]) -> list[CollectedPart]:
    """The crash's rows as the parts of the backends that recorded them (`statuses`: theirs, by name,
    added where missing): the host's spans and instants and torch's operators, without their args (not
    written at a crash); what was still open then ends at the crash, with ``"finished": false``."""
    parts = []
    if crash.threads:
        parts.append(_host_part(crash, statuses.setdefault("host", BackendStatus("host"))))
    if crash.op_threads:
        parts.append(_torch_part(crash, statuses.setdefault("torch", BackendStatus("torch"))))
    return parts


def _torch_part(crash: Crash, status: BackendStatus) -> CollectedPart:
    sink = Sink("torch")
    host = sink.host_device()
    for thread in crash.op_threads:
        row = sink.host_thread(thread.tid)
        for start, end, name in thread.ops.tolist():
            sink.activity(ActivityKind.CPU_OP, thread.names[name] if 0 <= name < len(thread.names) else UNNAMED,
                          device=host, resource=row, start=start, end=end or max(start, crash.at_ns),
                          args={} if end else {"finished": False})
    return sink.seal(status)


def _host_part(crash: Crash, status: BackendStatus) -> CollectedPart:
    from polyprof.plugin.recorder_rows import thread_rows, unfinished_spans

    sink = Sink("host")
    host = sink.host_device()
    for thread in crash.threads:
        row = sink.host_thread(thread.tid)
        if len(thread.rows):
            codes = thread.rows[:, 5]
            names = [thread.names[c] if 0 <= c < len(thread.names) else UNNAMED for c in codes.tolist()]
            thread_rows(sink, host, row, np.ascontiguousarray(thread.rows[:, :5]), names, [None] * len(names))
        unfinished_spans(sink, host, row, thread.open_spans, crash.at_ns)
    return sink.seal(status)
