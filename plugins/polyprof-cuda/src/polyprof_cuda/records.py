"""CUPTI activity records -> numpy columns, at stop.

The session keeps CUPTI's buffers raw while the program runs (:mod:`polyprof_cuda.raw_buffers`). After
stop, as Kineto parses its buffers, :func:`decode` walks each buffer once and reads each field the
mapping needs for all records of a kind at once, through the numpy dtype that cupti-python publishes
for the record's C struct (``activity_kernel10_dtype``...).

    decoded = decode(pool.take(), kind_to_family, newest_layouts(cupti_module), lib.next_record, 10**7)
    decoded.columns[KERNEL]["correlation_id"]  # -> np.ndarray
"""

from __future__ import annotations

import ctypes
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from polyprof.plugin import CodedStrings
from polyprof.plugin.records import sorted_unique
from polyprof.plugin.records import walk_tagged_records as walk

# Record families.
KERNEL, MEMCPY, MEMCPY_P2P, MEMSET, RUNTIME, DRIVER, SYNC, OVERHEAD, EXTERNAL = (
    "kernel",
    "memcpy",
    "memcpy_p2p",
    "memset",
    "runtime",
    "driver",
    "sync",
    "overhead",
    "external",
)

#: CUPTI ActivityKind names -> family. CONCURRENT_KERNEL and KERNEL share a layout.
KIND_FAMILIES = {
    "CONCURRENT_KERNEL": KERNEL,
    "KERNEL": KERNEL,
    "MEMCPY": MEMCPY,
    "MEMCPY2": MEMCPY_P2P,
    "MEMSET": MEMSET,
    "RUNTIME": RUNTIME,
    "DRIVER": DRIVER,
    "SYNCHRONIZATION": SYNC,
    "OVERHEAD": OVERHEAD,
    "EXTERNAL_CORRELATION": EXTERNAL,
}

#: Activity kinds enabled by default (what Kineto's CUDA path records).
DEFAULT_KINDS = (
    "CONCURRENT_KERNEL",
    "MEMCPY",
    "MEMCPY2",
    "MEMSET",
    "RUNTIME",
    "DRIVER",
    "SYNCHRONIZATION",
    "OVERHEAD",
    "EXTERNAL_CORRELATION",
)

_TRANSFER = ("bytes", "start", "end", "device_id", "context_id", "stream_id", "correlation_id")
_API = ("cbid", "start", "end", "thread_id", "correlation_id")
#: The fields read per family (names as in cupti.pyi and the layouts' dtypes).
FIELDS: dict[str, tuple[str, ...]] = {
    KERNEL: (
        "name",
        "start",
        "end",
        "queued",
        "device_id",
        "context_id",
        "stream_id",
        "correlation_id",
        "registers_per_thread",
        "static_shared_memory",
        "dynamic_shared_memory",
        "grid_x",
        "grid_y",
        "grid_z",
        "block_x",
        "block_y",
        "block_z",
        "graph_id",
        "graph_node_id",
        "channel_id",
        "channel_type",
    ),
    MEMCPY: ("copy_kind", "src_kind", "dst_kind", *_TRANSFER),
    MEMCPY_P2P: ("copy_kind", "src_kind", "dst_kind", *_TRANSFER, "src_device_id", "dst_device_id"),
    MEMSET: ("memory_kind", *_TRANSFER),
    RUNTIME: _API,
    DRIVER: _API,
    SYNC: ("type", "start", "end", "context_id", "stream_id", "correlation_id", "cuda_event_id"),
    OVERHEAD: ("overhead_kind", "start", "end", "object_kind"),
    EXTERNAL: ("external_kind", "external_id", "correlation_id"),
}
#: CUPTI_TIMESTAMP_UNKNOWN (~0 as uint64), as the int64 that decode() gives timestamps.
TIMESTAMP_UNKNOWN = -1
#: Fields that older layouts lack: read as 0 there.
OPTIONAL_FIELDS = frozenset(
    {"queued", "graph_id", "graph_node_id", "channel_id", "channel_type", "cuda_event_id", "object_kind"}
)


#: Each family's record layouts in cupti-python: the dtype attribute names start so, then a version.
_LAYOUT_NAMES = {
    KERNEL: "activity_kernel",
    MEMCPY: "activity_memcpy",
    MEMCPY_P2P: "activity_memcpy_pto_p",
    MEMSET: "activity_memset",
    RUNTIME: "activity_api",
    DRIVER: "activity_api",
    SYNC: "activity_synchronization",
    OVERHEAD: "activity_overhead",
    EXTERNAL: "activity_external_correlation",
}


def newest_layouts(module: Any) -> dict[str, tuple[str, np.dtype]]:
    """Per family, the newest record layout cupti-python publishes a dtype for (the one the libcupti of
    the same release writes): ``{KERNEL: ("activity_kernel10_dtype", dtype), ...}``. Releases name
    them ``activity_kernel10_dtype`` or ``c_upti_activity_kernel9_dtype``."""
    found: dict[str, tuple[int, str, np.dtype]] = {}
    for attr in dir(module):
        for family, prefix in _LAYOUT_NAMES.items():
            m = re.fullmatch(r"(?:c_upti_)?" + prefix + r"(\d*)_dtype", attr)
            dtype = getattr(module, attr, None) if m else None
            if m and isinstance(dtype, np.dtype) and dtype.names:
                number = int(m.group(1) or 0)
                if family not in found or number > found[family][0]:
                    found[family] = (number, attr, dtype)
    return {family: (name, dtype) for family, (_, name, dtype) in found.items()}


class _Memory:
    """Records of one layout at byte `offsets` in `buffer`, read one field for all of them at once."""

    def __init__(self, buffer: np.ndarray, offsets: np.ndarray, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.mem = buffer[: len(buffer) - len(buffer) % 8]
        self.rel = offsets
        self.aligned = buffer.ctypes.data % 8 == 0 and not np.any(offsets & 7)

    def field(self, name: str) -> np.ndarray:
        """The field for every record, as int64 (uint64 for ``name``, a pointer)."""
        ftype, offset = self.dtype.fields[name][:2]
        if self.aligned and ftype.shape == () and offset % ftype.itemsize == 0:
            values = self.mem.view(ftype)[(self.rel + offset) // ftype.itemsize]
        else:  # unaligned records or fields: copy whole records, then take the field
            rows = self.mem[self.rel[:, None] + np.arange(self.dtype.itemsize)]
            values = np.ascontiguousarray(rows).view(self.dtype).reshape(-1)[name]
        return values.astype(np.uint64 if name == "name" else np.int64)


class Decoded:
    """What :func:`decode` found: columns per family, records past the cap, problems in words."""

    def __init__(self) -> None:
        self.columns: dict[str, dict[str, Any]] = {}
        self.records = 0
        self.over_cap = 0
        self.problems: list[str] = []


def decode(
    buffers: list[tuple[np.ndarray, int]],
    kind_family: dict[int, str],
    layouts: dict[str, tuple[str, np.dtype]],
    next_record: Callable[[int, int, int], int | None],
    max_records: int,
) -> Decoded:
    """Columns per family from raw CUPTI buffers ``(memory, valid bytes)``, oldest first; records past
    the first `max_records` are counted, not read.

    Each buffer is walked once (:func:`~polyprof_cuda.raw_buffers.walk`); then, per kind, each field the
    mapping needs is read for all of the kind's records at once through its layout's dtype. Kernel names
    are read here, while CUPTI's name strings are certainly alive: the ``name`` column is a
    :class:`~polyprof.model.CodedStrings`."""
    out = Decoded()
    sizes: dict[int, int] = {}
    parts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    for buffer, valid in buffers:
        kinds, offsets = walk(buffer, valid, sizes, next_record)
        room = max(max_records - out.records, 0)
        if len(kinds) > room:
            out.over_cap += len(kinds) - room
            kinds, offsets = kinds[:room], offsets[:room]
        out.records += len(kinds)
        for kind in sorted_unique(kinds).tolist():
            family = kind_family.get(kind)
            if family is None:
                continue
            rows = offsets[kinds == kind]
            layout = layouts.get(family)
            problem = _layout_problem(family, layout, sizes.get(kind))
            if problem:
                skipped[problem] += len(rows)
                continue
            assert layout is not None
            memory = _Memory(buffer, rows, layout[1])
            cols = {
                f: memory.field(f) if f in layout[1].names else np.zeros(len(rows), dtype=np.int64)
                for f in FIELDS[family]
            }
            if "name" in cols:
                cols["name"] = CodedStrings(*coded_names(cols["name"]))
            parts[family].append(cols)
    out.problems = [f"{problem}: {n} records skipped" for problem, n in skipped.items()]
    out.columns = {family: _concat(chunks) for family, chunks in parts.items()}
    return out


def _layout_problem(family: str, layout: tuple[str, np.dtype] | None, record_size: int | None) -> str:
    """Why records of `family` cannot be read with `layout` ('' when they can)."""
    if layout is None:
        return f"cupti-python publishes no record layout (dtype) for {family} records"
    name, dtype = layout
    missing = [f for f in FIELDS[family] if f not in OPTIONAL_FIELDS and f not in dtype.names]
    if missing:
        return f"{name} has no field(s) {missing}"
    if record_size is not None and record_size < dtype.itemsize:
        return (
            f"libcupti writes {family} records of {record_size} bytes, smaller than cupti-python's {name} "
            f"({dtype.itemsize} bytes): install the cupti-python release matching your libcupti"
        )
    return ""


def _concat(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    if len(chunks) == 1:
        return chunks[0]
    out: dict[str, Any] = {}
    for key in chunks[0]:
        values = [c[key] for c in chunks]
        out[key] = _merge_coded(values) if isinstance(values[0], CodedStrings) else np.concatenate(values)
    return out


def _codes_in(index: dict[str, int], names: Any) -> np.ndarray:
    """Each name's code in `index`, adding the names it lacks (codes count up from 0)."""
    return np.array([index.setdefault(name, len(index)) for name in names], dtype=np.int64)


def _merge_coded(parts: list[CodedStrings]) -> CodedStrings:
    """One coded column from several, each with its own table."""
    index: dict[str, int] = {}
    codes = []
    for part in parts:
        remap = _codes_in(index, part.table)
        codes.append(remap[part.codes] if len(remap) else part.codes)
    return CodedStrings(np.concatenate(codes), list(index))


def _name_at(pointer: int) -> str:
    return ctypes.string_at(pointer).decode(errors="replace") if pointer else "<unnamed kernel>"


def coded_names(column: Any) -> tuple[np.ndarray, list[str]]:
    """``(codes, table)`` for a ``name`` column, of C string pointers (CUPTI shares one string per
    kernel function, so each distinct pointer is read once) or of names: each distinct name once in
    the table, each row a code into it."""
    index: dict[str, int] = {}
    if not isinstance(column, np.ndarray):
        return _codes_in(index, column), list(index)
    ptrs = column.astype(np.uint64)
    distinct = sorted_unique(ptrs)
    # two pointers may hold the same name: codes go by name, not by pointer
    code_of_pointer = _codes_in(index, [_name_at(p) for p in distinct.tolist()])
    return code_of_pointer[np.searchsorted(distinct, ptrs)], list(index)
