"""CUPTI's activity buffers, owned by polyprof and kept raw until collect.

cupti-python's buffer callbacks turn every record into a Python object before user code sees it (on
an H200, ~85 us per record: 1.7 s to flush 20,000 records). So polyprof hands CUPTI its own buffers
through libcupti's ``cuptiActivityRegisterCallbacks`` (ctypes, :mod:`polyprof_cuda.libcupti`) and, as
Kineto does, keeps each filled buffer as it is: the completed callback, on CUPTI's thread, only
appends (address, valid size) to a list. After stop, :func:`polyprof.plugin.records.walk_tagged_records` finds the records in each buffer and
:mod:`polyprof_cuda.records` reads their fields through the numpy dtypes cupti-python publishes.

    pool = BufferPool(buffer_bytes=8 << 20, max_bytes=4 << 30)
    layer.register_buffer_callbacks(pool.requested, pool.completed)
    ...  # trace, then flush
    for buffer, valid in pool.take(): ...
"""

from __future__ import annotations

import threading

import numpy as np

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

