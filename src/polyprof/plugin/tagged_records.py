"""Walking buffers of kind-tagged, fixed-size-per-kind records (device tracing libraries' activity
buffers). Device-neutral: the layout is the caller's, see :func:`walk_tagged_records`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polyprof import _native

#: Record kinds the size table covers (CUPTI's and PTI's kinds are well below); larger kinds are still
#: walked, each asking the library for its size.
KIND_TABLE = 1024


def walk_tagged_records(
    buffer: np.ndarray, valid: int, sizes: dict[int, int], next_record: Callable[[int, int, int], int | None]
) -> tuple[np.ndarray, np.ndarray]:
    """(kinds, byte offsets) of the records in `buffer`'s first `valid` bytes, in order.

    For the buffers device tracing libraries fill (CUPTI's activity buffers, PTI's view buffers): every
    record starts with its kind (uint32) and records of one kind have one size. The size of each kind is
    learned once, from the library's own walk (`next_record`: buffer address, valid bytes, record address
    -> the next record's address, None after the last; e.g. ``cuptiActivityGetNextRecord``), and kept in
    `sizes` for the next buffers; the rest of the walk is arithmetic (:func:`polyprof._native.walk_tagged_records`)::

        sizes = {}
        kinds, offsets = walk_tagged_records(buffer, valid, sizes, next_record)
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
        count, offset = _native.walk_tagged_records(buffer, offset, valid, table, kinds[n:], offsets[n:])
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

