"""The rows a crash left: what each thread had recorded (spans, instants) since the last hand-over,
written by the C recorder at a fatal signal into ``SPILL.crash`` beside a flight recorder's spill
(``csrc/recorder.c``, "The crash dump", gives the layout). ``polyprof recover SPILL`` reads it with the
spill::

    crash = read_crash(open("flight/flight-rank0.spill.crash", "rb").read())
    crash.at_ns, [len(t.rows) for t in crash.threads]
    part = crash_part(crash, status)          # the host backend's rows, for the merge

A file cut short (the process died while writing it) gives the threads read whole before the cut.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from polyprof.model import BackendStatus, CollectedPart
from polyprof.sink import Sink

MAGIC = b"PPCRASH1"
#: the crash file's name: the spill's, with this added
CRASH_SUFFIX = ".crash"
#: a row's fields: type, start, end, id, parent, name code (-1: its name was not written)
ROW_FIELDS = 6
UNNAMED = "<name not written at the crash>"


@dataclass
class CrashedThread:
    tid: int
    rows: np.ndarray  # (n, ROW_FIELDS) int64
    names: list[str]
    open_spans: list[tuple[str, None, int, int, int]]  # (name, args, start, id, parent)


@dataclass
class Crash:
    at_ns: int = 0
    threads: list[CrashedThread] = field(default_factory=list)
    whole: bool = False  # the end marker was reached

    @property
    def rows(self) -> int:
        return sum(len(t.rows) + len(t.open_spans) for t in self.threads)


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
        while reader.i64() == 1:
            tid, n_rows, n_names, n_open = (reader.i64() for _ in range(4))
            rows = np.frombuffer(reader.take(n_rows * ROW_FIELDS * 8), dtype="<i8").reshape(n_rows, ROW_FIELDS)
            names = [reader.text() for _ in range(n_names)]
            open_spans = []
            for _ in range(n_open):
                start, ident, parent = reader.i64(), reader.i64(), reader.i64()
                open_spans.append((reader.text(), None, start, ident, parent))
            crash.threads.append(CrashedThread(tid, rows.astype(np.int64), names, open_spans))
        crash.whole = True
    except _Cut:
        pass
    return crash


def crash_part(crash: Crash, status: BackendStatus) -> CollectedPart:
    """The crash's rows as the host backend's part: spans and instants as the host backend writes them,
    without their args (not written at a crash); the spans still open then end at the crash, with
    ``"finished": false``."""
    from polyprof.backends.host import thread_rows, unfinished_spans

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
