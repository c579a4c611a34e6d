"""Per-row args of an activity table: a dict for single rows, and column blocks for backends that bring
the same keys for many rows (a kernel's device, stream, grid...), so no dict is built per row until
someone asks for one::

    args = Args({0: {"error": "CL_INVALID_VALUE"}})
    args.add_block(np.array([1, 2]), ArgColumns(("stream", "device"), (np.array([7, 7]), np.array([0, 1]))))
    args[2]                 # -> {'stream': 7, 'device': 1}
    args.rows()             # -> array([0, 1, 2])

``Args`` is a read-only ``Mapping[int, dict]``; the exporter formats blocks column-wise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson


class ArgColumns(NamedTuple):
    """Args of a batch of rows as columns: row i's args are ``{k: column[i] for k, column in zip(keys,
    columns)}``. Give numbers as numpy arrays; any other column is a sequence of JSON-able values, or a
    :class:`JSONColumn` of values already encoded."""

    keys: tuple[str, ...]
    columns: tuple[Any, ...]


class JSONColumn(NamedTuple):
    """A column of JSON-encoded values (bytes), written to the trace as they are and decoded only when
    a row's args are read; ``b""`` means the row has no such key. For backends whose native side
    formats args already (the torch observer's record_shapes args)."""

    values: Sequence[bytes]

    def __len__(self) -> int:  # the column's length, not the tuple's
        return len(self.values)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` for a 1-D array, without np.unique, whose first call imports numpy.ma
    (~7 ms, paid at the stop of a profile)."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def _as_column(values: Any, n: int) -> np.ndarray:
    if isinstance(values, JSONColumn):
        return JSONArray.of(values.values, n)
    if isinstance(values, np.ndarray) and values.ndim == 1:
        return values
    # object arrays keep tuples and strings as they are (np.asarray would turn tuples into a 2-D array)
    return np.fromiter(values, dtype=object, count=n)


class JSONArray(np.ndarray):
    """An object array of JSON-encoded values: keeps its type through indexing and slicing."""

    @classmethod
    def of(cls, values: Iterable[bytes], n: int) -> JSONArray:
        return np.fromiter(values, dtype=object, count=n).view(cls)


def is_json_column(column: np.ndarray) -> bool:
    return isinstance(column, JSONArray)


class ArgsBlock:
    __slots__ = ("rows", "keys", "columns")

    def __init__(self, rows: np.ndarray, keys: tuple[str, ...], columns: list[np.ndarray]) -> None:
        self.rows = rows  # ascending row numbers
        self.keys = keys
        self.columns = columns

    def position(self, row: int) -> int:
        p = int(np.searchsorted(self.rows, row))
        return p if p < len(self.rows) and self.rows[p] == row else -1

    def dict_at(self, p: int) -> dict[str, Any]:
        out = {}
        for k, c in zip(self.keys, self.columns, strict=True):
            if isinstance(c, JSONArray):
                if c[p]:
                    out[k] = orjson.loads(c[p])
            else:
                out[k] = _python(c[p])
        return out


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


class Args(Mapping):
    """Row number -> args dict. Rows with both a dict and a block entry get the block's keys, then
    the dict's (the dict wins on a shared key)."""

    __slots__ = ("dicts", "blocks")

    def __init__(self, dicts: dict[int, dict] | None = None, blocks: list[ArgsBlock] | None = None) -> None:
        self.dicts: dict[int, dict] = dicts if dicts is not None else {}
        self.blocks: list[ArgsBlock] = blocks if blocks is not None else []

    @classmethod
    def of(cls, args: Mapping[int, dict] | None) -> Args:
        if isinstance(args, Args):
            return args
        return cls(dict(args) if args else {})

    def add_block(self, rows: np.ndarray, block: ArgColumns) -> None:
        """Args for `rows` (ascending row numbers, one per column entry)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0 or not block.keys:
            return
        if len(block.keys) != len(block.columns):
            raise ValueError(f"ArgColumns has {len(block.keys)} keys but {len(block.columns)} columns")
        columns = [_as_column(c, len(rows)) for c in block.columns]
        for key, c in zip(block.keys, columns, strict=True):
            if len(c) != len(rows):
                raise ValueError(f"arg column {key!r} has {len(c)} values for {len(rows)} rows")
        if len(rows) > 1 and not (np.diff(rows) > 0).all():
            order = np.argsort(rows, kind="stable")
            rows, columns = rows[order], [c[order] for c in columns]
        self.blocks.append(ArgsBlock(rows, tuple(block.keys), columns))

    # -- Mapping ----------------------------------------------------------------------------------
    def __getitem__(self, row: int) -> dict[str, Any]:
        merged: dict[str, Any] | None = None
        for b in self.blocks:
            p = b.position(row)
            if p >= 0:
                merged = b.dict_at(p) if merged is None else {**merged, **b.dict_at(p)}
        own = self.dicts.get(row)
        if merged is None:
            if own is None:
                raise KeyError(row)
            return own
        return {**merged, **own} if own else merged

    def __contains__(self, row: object) -> bool:
        if row in self.dicts:
            return True
        return isinstance(row, (int, np.integer)) and any(b.position(int(row)) >= 0 for b in self.blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows().tolist())

    def __len__(self) -> int:
        return len(self.rows())

    def __bool__(self) -> bool:
        return bool(self.dicts) or any(len(b.rows) for b in self.blocks)

    def __repr__(self) -> str:
        return f"Args({len(self.dicts)} dict rows, {sum(len(b.rows) for b in self.blocks)} column rows)"

    # -- bulk -------------------------------------------------------------------------------------
    def as_dicts(self) -> dict[int, dict[str, Any]]:
        """Every row's args at once, as ``args[row]`` gives them (block keys, then the dict's): one pass
        over each block's columns, where looking rows up one by one searches every block per row."""
        out: dict[int, dict[str, Any]] = {}
        for b in self.blocks:
            columns = [c if isinstance(c, JSONArray) else c.tolist() for c in b.columns]
            for p, row in enumerate(b.rows.tolist()):
                d = {}
                for k, c in zip(b.keys, columns, strict=True):
                    if isinstance(c, JSONArray):
                        if c[p]:
                            d[k] = orjson.loads(c[p])
                    else:
                        d[k] = c[p]
                before = out.get(row)
                out[row] = {**before, **d} if before is not None else d
        for row, own in self.dicts.items():
            before = out.get(row)
            out[row] = {**before, **own} if before is not None else own
        return out

    def rows(self) -> np.ndarray:
        """Every row that has args, ascending."""
        parts = [np.fromiter(self.dicts, dtype=np.int64, count=len(self.dicts))]
        parts.extend(b.rows for b in self.blocks)
        return sorted_unique(np.concatenate(parts))

    def take(self, indices: np.ndarray) -> Args:
        """Args of the table ``table.take(indices)``: new row p has old row ``indices[p]``'s args."""
        indices = np.asarray(indices, dtype=np.int64)
        if not self or not len(indices):
            return Args()
        order = np.argsort(indices, kind="stable")
        wanted = indices[order]  # sorted: where each old row went is found by binary search

        def new_positions(old_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(mask of old_rows that were taken, the new position of each of those)."""
            pos = np.searchsorted(wanted, old_rows)
            hit = (pos < len(wanted)) & (wanted[np.minimum(pos, len(wanted) - 1)] == old_rows)
            return hit, order[pos[hit]]

        dicts: dict[int, dict] = {}
        if self.dicts:
            old = np.fromiter(self.dicts, dtype=np.int64, count=len(self.dicts))
            hit, new = new_positions(old)
            values = self.dicts
            dicts = {n: values[o] for n, o in zip(new.tolist(), old[hit].tolist(), strict=True)}
        blocks = []
        for b in self.blocks:
            hit, new = new_positions(b.rows)
            if hit.any():
                at = np.flatnonzero(hit)
                if len(new) > 1 and not (np.diff(new) > 0).all():
                    resort = np.argsort(new, kind="stable")
                    new, at = new[resort], at[resort]
                blocks.append(ArgsBlock(new, b.keys, [c[at] for c in b.columns]))
        return Args(dicts, blocks)

    def renumbered(self, new_row: np.ndarray) -> Args:
        """The same args with row r moved to ``new_row[r]`` (an increasing map, e.g. when rows are
        inserted between others)."""
        new_row = np.asarray(new_row, dtype=np.int64)
        return Args(
            {int(new_row[i]): a for i, a in self.dicts.items()},
            [ArgsBlock(new_row[b.rows], b.keys, b.columns) for b in self.blocks],
        )

    def shifted(self, offset: int) -> Args:
        """The same args for rows numbered `offset` higher (for concatenating tables)."""
        if not offset:
            return self
        return Args(
            {i + offset: a for i, a in self.dicts.items()},
            [ArgsBlock(b.rows + offset, b.keys, b.columns) for b in self.blocks],
        )

    @staticmethod
    def combine(parts: list[Args]) -> Args:
        out = Args()
        for p in parts:
            out.dicts.update(p.dicts)
            out.blocks.extend(p.blocks)
        return out
