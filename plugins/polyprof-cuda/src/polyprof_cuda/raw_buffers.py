"""CUPTI's activity buffers, owned by polyprof and kept raw until collect.

cupti-python's buffer callbacks turn every record into a Python object before user code sees it (on
an H200, ~85 us per record: 1.7 s to flush 20,000 records). So polyprof hands CUPTI its own buffers
through libcupti's ``cuptiActivityRegisterCallbacks`` (ctypes, :mod:`polyprof_cuda.libcupti`) and, as
Kineto does, keeps each filled buffer as it is: the completed callback, on CUPTI's thread, only
appends (address, valid size) to a list. After stop, :func:`walk` finds the records in each buffer and
:mod:`polyprof_cuda.records` reads their fields through the numpy dtypes cupti-python publishes.

    pool = BufferPool(buffer_bytes=8 << 20, max_bytes=4 << 30)
    layer.register_buffer_callbacks(pool.requested, pool.completed)
    ...  # trace, then flush
    for buffer, valid in pool.take(): ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from polyprof._accel import speedups

#: CUPTI wants buffers aligned to 8 bytes (ACTIVITY_RECORD_ALIGNMENT).
ALIGNMENT = 8


class BufferPool:
    """Buffers lent to CUPTI and the filled ones kept for collect.

    ``requested``/``completed`` are the two buffer callbacks, in plain Python terms: CUPTI asks for a
    buffer (its address and size) and later hands it back with the number of bytes it filled. Filled
    buffers are kept untouched until :meth:`take`; empty ones are reused. Past ``max_bytes`` of kept
    records a filled buffer is dropped (and counted) instead, so a long trace cannot exhaust memory.
    """

    def __init__(self, buffer_bytes: int, max_bytes: int) -> None:
        self.buffer_bytes = buffer_bytes
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._lent: dict[int, np.ndarray] = {}
        self._kept: list[tuple[np.ndarray, int]] = []
        self.kept_bytes = 0
        self.dropped_buffers = 0
        self.dropped_bytes = 0
        self.unknown_buffers = 0  # handed back but never lent by this pool (another session's)

    def requested(self) -> tuple[int, int]:
        """(address, size) of a buffer for CUPTI to fill."""
        with self._lock:
            buf = self._free.pop() if self._free else _aligned(self.buffer_bytes)
            addr = buf.ctypes.data
            self._lent[addr] = buf
        return addr, self.buffer_bytes

    def completed(self, addr: int, valid: int) -> None:
        """CUPTI hands a buffer back with `valid` bytes of records in it: keep it, or reuse it when empty."""
        with self._lock:
            buf = self._lent.pop(addr, None)
            if buf is None:
                self.unknown_buffers += 1
                return
            if valid <= 0:
                self._free.append(buf)
            elif self.kept_bytes >= self.max_bytes:
                self.dropped_buffers += 1
                self.dropped_bytes += valid
                self._free.append(buf)
            else:
                self._kept.append((buf, valid))
                self.kept_bytes += valid

    def take(self) -> list[tuple[np.ndarray, int]]:
        """The filled buffers, oldest first (each kept alive by the caller from now on)."""
        with self._lock:
            kept, self._kept = self._kept, []
            self.kept_bytes = 0
        return kept

    @property
    def lent(self) -> int:
        """Buffers CUPTI still holds (0 after a forced flush)."""
        return len(self._lent)


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGNMENT
    return raw[skip : skip + nbytes]


#: Record kinds the size table covers (CUPTI's and PTI's kinds are well below); larger kinds are still
#: walked, each asking the library for its size.
KIND_TABLE = 1024


def walk(
    buffer: np.ndarray, valid: int, sizes: dict[int, int], next_record: Callable[[int, int, int], int | None]
) -> tuple[np.ndarray, np.ndarray]:
    """(kinds, byte offsets) of the records in `buffer`'s first `valid` bytes, in order.

    Every record starts with its kind (uint32) and records of one kind have one size: the size of each
    kind is learned once, from the library's walk (`next_record`: buffer address, valid bytes, record
    address -> the next record's address, None after the last; libcupti's ``cuptiActivityGetNextRecord``)
    and kept in `sizes` for the next buffers; the rest of the walk is arithmetic, in C when polyprof's
    speedups are built.
    """
    base = buffer.ctypes.data
    table = np.zeros(KIND_TABLE, dtype=np.int64)
    for kind, size in sizes.items():
        if kind < KIND_TABLE:
            table[kind] = size
    kinds = np.empty(valid // 8 + 1, dtype=np.int64)
    offsets = np.empty(valid // 8 + 1, dtype=np.int64)
    words = memoryview(buffer[: valid - valid % 4]).cast("I")
    n = offset = 0
    while offset < valid:
        count, offset = _steps(buffer, offset, valid, table, kinds[n:], offsets[n:], words)
        n += count
        if offset >= valid:
            break
        kind = words[offset >> 2]  # of unknown size: ask the library where the next record starts
        kinds[n], offsets[n] = kind, offset
        n += 1
        following = next_record(base, valid, base + offset)
        if following is None:  # the buffer's last record
            break
        size = following - (base + offset)
        if size <= 0:
            raise ValueError(f"the record walk went backwards at byte {offset} (kind {kind})")
        sizes[kind] = size
        if kind < KIND_TABLE:
            table[kind] = size
        offset += size
    return kinds[:n].copy(), offsets[:n].copy()


def _steps(
    buffer: np.ndarray,
    start: int,
    valid: int,
    table: np.ndarray,
    kinds: np.ndarray,
    offsets: np.ndarray,
    words,
) -> tuple[int, int]:
    """Records of known size from `start`: (how many were written to kinds/offsets, where it stopped)."""
    if speedups is not None:
        return speedups.walk_tagged_records(buffer, start, valid, table, kinds, offsets)
    count, offset, known = 0, start, len(table)
    while offset + 4 <= valid:
        kind = words[offset >> 2]
        size = int(table[kind]) if kind < known else 0
        if size <= 0:
            break
        kinds[count], offsets[count] = kind, offset
        count += 1
        offset += size
    return count, offset
