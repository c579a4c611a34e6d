"""CUPTI activity records -> numpy columns, at collect time.

CUPTI's buffer-completed callback runs on a CUPTI thread while the program runs, and Python code there
holds the GIL the program needs, so the session only keeps the list of record objects cupti-python
hands it (each record keeps its buffer alive) and returns. After stop, as Kineto parses its buffers,
:func:`decode` turns them into one column per field: records are grouped by layout (class), and each
field the mapping needs is read for all records of a layout at once, through the numpy dtype that
cupti-python publishes for the layout's C struct (``activity_kernel13_dtype``...).

    columns, problems = decode(session_buffers, kind_to_family, cupti_module)
    columns[KERNEL]["correlation_id"]  # -> np.ndarray
"""

from __future__ import annotations

import ctypes
import re
from collections import defaultdict
from typing import Any

import numpy as np

from polyprof.model import CodedStrings
from polyprof.model.args import sorted_unique

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


def dtype_name(class_name: str) -> str:
    """cupti-python's name for a layout's numpy dtype: ActivityMemcpyPtoP4 -> activity_memcpy_pto_p4_dtype."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", class_name).lower() + "_dtype"


def layout_dtype(module: Any, cls: type) -> np.dtype | None:
    dtype = getattr(module, dtype_name(cls.__name__), None)
    return dtype if isinstance(dtype, np.dtype) and dtype.names else None


class _Memory:
    """The memory of records at `ptrs` (all of one layout), read one field for all of them at once.

    A uint8 view spanning the lowest to the highest record is indexed only at the records' own
    bytes, so nothing between them is touched (they may sit in different CUPTI buffers)."""

    def __init__(self, ptrs: np.ndarray, dtype: np.dtype) -> None:
        self.dtype = dtype
        base = int(ptrs.min()) & ~7
        span = (int(ptrs.max()) + dtype.itemsize - base + 7) & ~7
        self.mem = np.frombuffer((ctypes.c_uint8 * span).from_address(base), dtype=np.uint8)
        self.rel = (ptrs - np.uint64(base)).astype(np.int64)
        self.aligned = not np.any(self.rel & 7)

    def field(self, name: str) -> np.ndarray:
        """The field for every record, as int64 (uint64 for ``name``, a pointer)."""
        ftype, offset = self.dtype.fields[name][:2]
        if self.aligned and ftype.shape == () and offset % ftype.itemsize == 0:
            values = self.mem.view(ftype)[(self.rel + offset) // ftype.itemsize]
        else:  # unaligned records or fields: copy whole records, then take the field
            rows = self.mem[self.rel[:, None] + np.arange(self.dtype.itemsize)]
            values = np.ascontiguousarray(rows).view(self.dtype).reshape(-1)[name]
        return values.astype(np.uint64 if name == "name" else np.int64)


def _by_attributes(records: list, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The slow path, for a layout without a published dtype: one attribute read per field and record."""
    out: dict[str, Any] = {}
    for f in fields:
        values = [getattr(r, f, 0) for r in records]
        if f == "name":
            out[f] = values
            continue
        try:
            out[f] = np.array(values, dtype=np.int64)
        except OverflowError:  # uint64 fields such as CUPTI_TIMESTAMP_UNKNOWN: as int64, like the fast path
            out[f] = np.array(values, dtype=np.uint64).astype(np.int64)
    return out


def decode(
    buffers: list[list], kind_family: dict[int, str], module: Any
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Columns per family from the buffers' record objects, and what could not be decoded (in words).

    Kernel names are read here, while the records (and whatever their name pointers point into) are
    alive: the ``name`` column is a :class:`~polyprof.model.CodedStrings`."""
    by_type: dict[type, list] = defaultdict(list)
    for records in buffers:
        for r in records:
            by_type[type(r)].append(r)
    parts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    problems = []
    for cls, records in by_type.items():
        kinds = np.fromiter((int(r.kind) for r in records), dtype=np.int64, count=len(records))
        dtype = layout_dtype(module, cls)
        memory = None
        if dtype is not None:
            ptrs = np.fromiter((r.ptr for r in records), dtype=np.uint64, count=len(records))
            memory = _Memory(ptrs, dtype)
        for kind in sorted_unique(kinds).tolist():
            family = kind_family.get(kind)
            if family is None:
                continue
            rows = np.flatnonzero(kinds == kind)
            everything = len(rows) == len(records)
            fields = FIELDS[family]
            missing = [
                f for f in fields if f not in OPTIONAL_FIELDS and dtype is not None and f not in dtype.names
            ]
            if missing:
                problems.append(
                    f"{cls.__name__} has no field(s) {missing}: {len(rows)} {family} records skipped"
                )
                continue
            if memory is None:
                chosen = records if everything else [records[i] for i in rows.tolist()]
                cols = _by_attributes(chosen, fields)
            else:
                cols = {}
                for f in fields:
                    if f in dtype.names:
                        column = memory.field(f)
                        cols[f] = column if everything else column[rows]
                    else:
                        cols[f] = np.zeros(len(rows), dtype=np.int64)
            if "name" in cols:
                cols["name"] = CodedStrings(*coded_names(cols["name"]))
            parts[family].append(cols)
    return {family: _concat(chunks) for family, chunks in parts.items()}, problems


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
