"""A rank's args as the store's JSON columns: the shapes (``Input Dims``, ``Input type``) in columns of
their own, the rest as one JSON object per row, and the args of the rows that name a collective as
dicts (read further by rank_tables).

The args a reader leaves as JSON text (one column per key, :class:`~polyprof.model.args.JSONArray`)
go into the columns as they are, without being parsed and encoded again; a row with args in several
places (blocks and dicts) is merged as ``trace.activities.args[row]`` merges it.

::

    columns = args_columns(trace.activities.args, len(trace.activities))
    columns.input_dims[row], columns.other[row], columns.collective   # JSON text or None; {row: dict}

A block's rows are formatted in C where polyprof's extension is in use (one JSON object per row from
the block's columns, ``_native.format_arg_objects``, as the JSON writer formats them), else row by
row in Python; the columns hold UTF-8 bytes or str, as ``pa.array(..., pa.string())`` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from polyprof import _native
from polyprof.model.args import Args, ArgsBlock, is_json_column

#: args kept in columns of their own
SHAPE_ARGS = {"Input Dims": "input_dims", "Input type": "input_types"}
#: the arg that makes a row a collective (its other args name the group, sequence, sizes)
COLLECTIVE_KEY = "Collective name"


@dataclass
class ArgColumns:
    """Per row (object arrays): JSON text (str or UTF-8 bytes) or None."""

    input_dims: np.ndarray
    input_types: np.ndarray
    other: np.ndarray
    collective: dict[int, dict[str, Any]] = field(default_factory=dict)


def encode(value: Any) -> str:
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def args_columns(args: Args, n: int) -> ArgColumns:
    out = ArgColumns(*(np.full(n, None, dtype=object) for _ in range(3)))
    if not args:
        return out
    placed = np.concatenate([b.rows for b in args.blocks] + [np.fromiter(args.dicts, np.int64, len(args.dicts))])
    rows, counts = np.unique(placed, return_counts=True)
    merged = set(rows[counts > 1].tolist())  # in several places: merged as args[row] merges them
    for block in args.blocks:
        _block_as_text(block, merged, out)
    for row in merged | set(args.dicts):
        _dict_into(row, args[row], out)
    return out


def _dict_into(row: int, values: dict[str, Any], out: ArgColumns) -> None:
    rest = dict(values)
    for key, column in SHAPE_ARGS.items():
        if key in rest:
            getattr(out, column)[row] = encode(rest.pop(key))
    out.other[row] = encode(rest) if rest else None
    if COLLECTIVE_KEY in values:
        out.collective[row] = values


def _block_as_text(block: ArgsBlock, merged: set[int], out: ArgColumns) -> None:
    """One block's rows (but those in `merged`) into `out`: each key's values as JSON text, joined."""
    alone = ~np.isin(block.rows, np.fromiter(merged, np.int64, len(merged)))
    rows = block.rows[alone]
    rest = [k for k in block.keys if k not in SHAPE_ARGS]
    if rest:
        from polyprof.formats.chrome.write import c_arg_column

        zeros = np.zeros(len(rows), dtype=np.int64)
        columns = [c_arg_column(c[alone]) for k, c in zip(block.keys, block.columns, strict=True) if k in rest]
        objects = _native.format_arg_objects(zeros, zeros, [orjson.dumps(k) for k in rest], columns)
        other = np.fromiter(objects, dtype=object, count=len(rows))
        other[other == b"{}"] = None
        out.other[rows] = other
    for key, column in zip(block.keys, block.columns, strict=True):
        if key in SHAPE_ARGS:
            values = column[alone] if is_json_column(column) else [orjson.dumps(v, default=str) for v in column[alone]]
            values = np.fromiter(values, dtype=object, count=len(rows))
            values[values == b""] = None
            getattr(out, SHAPE_ARGS[key])[rows] = values
    if COLLECTIVE_KEY in block.keys:
        for p in np.flatnonzero(alone).tolist():
            if (values := block.dict_at(p)).get(COLLECTIVE_KEY) is not None:
                out.collective[int(block.rows[p])] = values
