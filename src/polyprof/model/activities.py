"""Columnar activity storage: one numpy array per field, interned strings, sparse args.

A trace of a million kernels is twelve arrays and a string table, not a million Python objects.
Build one with :class:`ActivityBuilder`, then :meth:`ActivityBuilder.freeze` it::

    b = ActivityBuilder()
    b.append(ActivityKind.KERNEL, "kernel", "vector_add", device=1, resource=0, start=10, end=25)
    table = b.freeze()
    table["start"]          # -> array([10])
    table.row(0).name       # -> 'vector_add'
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from polyprof._native.shared import FLOW_NONE
from polyprof.model.args import ArgColumns, Args
from polyprof.model.kinds import ActivityKind
from polyprof.model.strings import StringTable, as_name, code_strings

#: (column, dtype). `correlation`, `external_id` and `flow_id` use 0 for "none".
COLUMNS: tuple[tuple[str, Any], ...] = (
    ("kind", np.uint8),
    ("cat", np.int32),
    ("name", np.int32),
    ("device", np.int32),
    ("resource", np.int32),
    ("start", np.int64),
    ("end", np.int64),
    ("correlation", np.int64),
    ("external_id", np.int64),
    ("flow_id", np.int64),
    ("flow_type", np.int8),
    ("flow_start", np.int8),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)

#: The one bound on time: a trace file's timestamps and durations (ns, the epoch offset added) lie within
#: +-TRACE_TIME_LIMIT_NS, which every reader accepts; rows and samples carry host-clock timestamps within
#: +-HOST_TIME_LIMIT_NS (the Sink refuses others), so that the epoch offset (below 2**61 until 2043) and
#: any difference of two of them stay within the file's bound.
TRACE_TIME_LIMIT_NS = 2**62
HOST_TIME_LIMIT_NS = TRACE_TIME_LIMIT_NS // 2


class CodedStrings(NamedTuple):
    """A string column given as integer `codes` into `table`, for backends with their own string
    table: ``CodedStrings(np.array([0, 1, 0]), ["aten::mm", "aten::add"])``."""

    codes: Any
    table: Sequence[str]


@dataclass(frozen=True)
class Activity:
    """A row of an :class:`ActivityTable`, materialised for inspection (tests, analysis, small traces)."""

    index: int
    kind: ActivityKind
    cat: str
    name: str
    device: int
    resource: int
    start: int
    end: int
    correlation: int
    external_id: int
    flow_id: int
    flow_type: int
    flow_start: bool
    args: dict[str, Any]

    @property
    def duration(self) -> int:
        return self.end - self.start


class ActivityTable:
    """Immutable columns of activities. Timestamps are host-clock nanoseconds."""

    __slots__ = ("strings", "columns", "args")

    def __init__(
        self, strings: StringTable, columns: dict[str, np.ndarray], args: Mapping[int, dict] | None
    ) -> None:
        self.strings = strings
        self.columns = columns
        self.args: Args = Args.of(args)

    @classmethod
    def empty(cls) -> ActivityTable:
        return cls(StringTable(), {n: np.zeros(0, dtype=t) for n, t in COLUMNS}, Args())

    def __len__(self) -> int:
        return len(self.columns["start"])

    def __getitem__(self, column: str) -> np.ndarray:
        return self.columns[column]

    def row(self, i: int) -> Activity:
        c = self.columns
        return Activity(
            index=i,
            kind=ActivityKind(int(c["kind"][i])),
            cat=self.strings[int(c["cat"][i])],
            name=self.strings[int(c["name"][i])],
            device=int(c["device"][i]),
            resource=int(c["resource"][i]),
            start=int(c["start"][i]),
            end=int(c["end"][i]),
            correlation=int(c["correlation"][i]),
            external_id=int(c["external_id"][i]),
            flow_id=int(c["flow_id"][i]),
            flow_type=int(c["flow_type"][i]),
            flow_start=bool(c["flow_start"][i]),
            args=self.args.get(i, {}),
        )

    def __iter__(self) -> Iterator[Activity]:
        return (self.row(i) for i in range(len(self)))

    def names(self) -> np.ndarray:
        """The name of every row as an object array (vectorised string lookup)."""
        return (
            np.asarray(self.strings.strings, dtype=object)[self.columns["name"]]
            if len(self)
            else np.zeros(0, dtype=object)
        )

    def take(self, indices: np.ndarray) -> ActivityTable:
        """A new table with the rows at `indices` (in that order); args follow their rows."""
        indices = np.asarray(indices, dtype=np.int64)
        columns = {n: a[indices] for n, a in self.columns.items()}
        return ActivityTable(self.strings, columns, self.args.take(indices) if self.args else Args())

    @classmethod
    def concat(
        cls,
        parts: Sequence[tuple[ActivityTable, np.ndarray, np.ndarray, int]],
    ) -> ActivityTable:
        """Merge tables into one with a shared string table.

        Each part is ``(table, device_map, resource_map, flow_offset)``: its device and resource
        columns are remapped through the arrays, and its flow ids shifted by `flow_offset`, so that
        ids from different backends cannot collide.
        """
        strings = StringTable()
        out: dict[str, list[np.ndarray]] = {n: [] for n in COLUMN_NAMES}
        args: list[Args] = []
        base = 0
        for table, device_map, resource_map, flow_offset in parts:
            n = len(table)
            if n == 0:
                continue
            string_map = np.array([strings.intern(s) for s in table.strings.strings], dtype=np.int32)
            for name in COLUMN_NAMES:
                col = table.columns[name]
                if name in ("cat", "name"):
                    col = string_map[col]
                elif name == "device":
                    col = device_map[col]
                elif name == "resource":
                    col = resource_map[col]
                elif name == "flow_id" and flow_offset:
                    col = np.where(col != 0, col + flow_offset, 0)
                out[name].append(col)
            if table.args:
                args.append(table.args.shifted(base))
            base += n
        if base == 0:
            return cls(strings, {n: np.zeros(0, dtype=t) for n, t in COLUMNS}, Args())
        columns = {n: np.concatenate(out[n]).astype(t, copy=False) for n, t in COLUMNS}
        return cls(strings, columns, Args.combine(args))


class ActivityBuilder:
    """Appends activities row by row (or column by column) and freezes them into a table.

    Rows from :meth:`append` collect in Python lists; :meth:`extend_columns` keeps its columns as numpy
    chunks, so a backend that brings a million rows at once never turns them into Python ints.
    Not thread-safe: give each producer its own builder.
    """

    __slots__ = ("strings", "_cols", "_chunks", "_chunk_rows", "_args", "_arg_blocks")

    def __init__(self, strings: StringTable | None = None) -> None:
        self.strings = strings or StringTable()
        self._cols: dict[str, list] = {n: [] for n in COLUMN_NAMES}  # rows appended since the last chunk
        self._chunks: list[dict[str, np.ndarray]] = []
        self._chunk_rows = 0
        self._args: dict[int, dict] = {}
        self._arg_blocks: list[tuple[int, ArgColumns]] = []

    def __len__(self) -> int:
        return self._chunk_rows + len(self._cols["start"])

    def append(
        self,
        kind: int,
        cat: str,
        name: str,
        device: int,
        resource: int,
        start: int,
        end: int,
        correlation: int = 0,
        external_id: int = 0,
        flow_id: int = 0,
        flow_type: int = FLOW_NONE,
        flow_start: bool = False,
        args: dict | None = None,
    ) -> int:
        c = self._cols
        row = len(self)
        intern = self.strings.intern
        c["kind"].append(int(kind))
        c["cat"].append(intern(cat))
        c["name"].append(intern(name))
        c["device"].append(device)
        c["resource"].append(resource)
        c["start"].append(start)
        c["end"].append(end)
        c["correlation"].append(correlation)
        c["external_id"].append(external_id)
        c["flow_id"].append(flow_id)
        c["flow_type"].append(flow_type)
        c["flow_start"].append(1 if flow_start else 0)
        if args:
            self._args[row] = args
        return row

    def extend_columns(
        self,
        columns: dict[str, Any],
        args: Mapping[int, dict] | None = None,
        arg_columns: ArgColumns | None = None,
    ) -> None:
        """Append many rows at once. `cat` and `name` are sequences of strings or :class:`CodedStrings`;
        missing optional columns default to 0; `args` maps row numbers (0-based within this batch) to
        dicts; `arg_columns` has one value per row in each column."""
        n = len(columns["start"])
        base = len(self)
        self._flush()
        chunk: dict[str, np.ndarray] = {}
        for name, dtype in COLUMNS:
            values = columns.get(name)
            if values is None:
                chunk[name] = np.zeros(n, dtype=dtype)
            elif name in ("cat", "name"):
                chunk[name] = self._intern_column(values)
            else:
                chunk[name] = np.asarray(values, dtype=dtype)
        self._chunks.append(chunk)
        self._chunk_rows += n
        if arg_columns is not None:
            self._arg_blocks.append((base, arg_columns))
        if args:
            for i, a in args.items():
                self._args[base + i] = a

    def _intern_column(self, values: Any) -> np.ndarray:
        intern = self.strings.intern
        if isinstance(values, CodedStrings):
            ids = np.array([intern(s) for s in values.table] or [0], dtype=np.int32)
            return ids[np.asarray(values.codes, dtype=np.int64)]
        codes, table = code_strings(values)  # each distinct string once
        ids = np.array([intern(as_name(s)) for s in table] or [0], dtype=np.int32)
        return ids[codes]

    def _flush(self) -> None:
        if self._cols["start"]:
            self._chunks.append({n: np.asarray(self._cols[n], dtype=t) for n, t in COLUMNS})
            self._chunk_rows += len(self._cols["start"])
            self._cols = {n: [] for n in COLUMN_NAMES}

    def freeze(self) -> ActivityTable:
        self._flush()
        args = Args(dict(self._args))
        for base, block in self._arg_blocks:
            n = len(block.columns[0]) if block.columns else 0
            args.add_block(np.arange(base, base + n, dtype=np.int64), block)
        if not self._chunks:
            return ActivityTable(self.strings, {n: np.zeros(0, dtype=t) for n, t in COLUMNS}, args)
        if len(self._chunks) == 1:  # the columns as handed over: no copy (the builder is done with them)
            columns = {n: self._chunks[0][n].astype(t, copy=False) for n, t in COLUMNS}
        else:
            columns = {
                n: np.concatenate([c[n] for c in self._chunks]).astype(t, copy=False) for n, t in COLUMNS
            }
        return ActivityTable(self.strings, columns, args)
