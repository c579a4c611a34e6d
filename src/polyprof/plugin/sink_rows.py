"""The Sink's row schema and checks: which columns a row has, and the rows of a hand-over checked,
rejected rows counted by reason and a call that cannot be understood raised, in the form the trace
stores (:mod:`polyprof.plugin.sink` is the API backends call; this is what it checks)::

    columns, args = columns_of_rows(pending_rows, rejected)            # rows of Sink.activity
    kept = checked_columns(columns, args, None, len(devices), resources, rejected, misuse)
    if kept is not None:
        builder.extend_columns(*kept)
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from polyprof.model import (
    DEFAULT_CATEGORY,
    FLOW_AC2G,
    FLOW_NAMES,
    FLOW_NONE,
    HOST_TIME_LIMIT_NS,
    ActivityKind,
    ArgColumns,
    CodedStrings,
    JSONColumn,
    Resource,
)
from polyprof.model.strings import as_name

REQUIRED_COLUMNS = ("kind", "name", "device", "resource", "start", "end")
#: optional column -> what it means when left out
OPTIONAL_COLUMNS = {
    "cat": "the kind's Kineto category (DEFAULT_CATEGORY)",
    "correlation": "0 (none)",
    "external_id": "0 (none)",
    "flow_id": "0 (no flow)",
    "flow_type": "ac2g (FLOW_AC2G) on rows with a flow_id, none on the others",
    "flow_start": "False (the row is the flow's end)",
}
#: Every column a row has, in both entry points.
ROW_COLUMNS = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
_INTEGER_COLUMNS = ("kind", "device", "resource", "start", "end", "correlation", "external_id", "flow_id", "flow_type")
_CATEGORY_BY_INT = {int(k): cat for k, cat in DEFAULT_CATEGORY.items()}
_CATEGORY_TABLE = [_CATEGORY_BY_INT.get(k, "") for k in range(int(max(ActivityKind)) + 1)]
_FLOW_TYPES = sorted({FLOW_NONE, *FLOW_NAMES})  # 0 (none), 1 (fwdbwd), 2 (ac2g): checked as a range
_INT_TYPES = {int, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8, ActivityKind}

def as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("bool is not an integer here")
    return operator.index(value)


_INT64_MAX = np.iinfo(np.int64).max


def _int_column(values: Any) -> tuple[np.ndarray | None, Any]:
    """(int64 column, mask of rows whose value is not an int64 or None) or (None, dtype) when the column
    is not made of integers at all. Unsigned values past int64 and Python ints beyond 64 bits are rows
    to reject, never wrapped around."""
    arr = values if isinstance(values, np.ndarray) else None
    if arr is None:
        try:
            arr = np.asarray(values)
        except (OverflowError, ValueError):
            arr = None
        if arr is None or arr.dtype.kind not in "iub":  # e.g. [0, 2**63] becomes float64: go row by row
            arr = np.array(list(values), dtype=object)
    kind = arr.dtype.kind
    if kind == "i" or kind == "b":
        return arr.astype(np.int64, copy=False), None
    if kind == "u":
        bad = arr > _INT64_MAX if arr.dtype.itemsize == 8 else None
        return np.where(bad, 0, arr).astype(np.int64) if bad is not None else arr.astype(np.int64), bad
    if kind == "O":  # Python ints, some beyond 64 bits (or not ints): row by row
        out = np.zeros(len(arr), dtype=np.int64)
        bad = np.zeros(len(arr), dtype=bool)
        for i, v in enumerate(arr.tolist()):
            try:
                out[i] = as_int(v)
            except (TypeError, ValueError, OverflowError):
                bad[i] = True
        return out, bad
    return None, arr.dtype


def subset(values: Any, keep: np.ndarray) -> Any:
    """The rows `keep` of a column in any form activities() takes."""
    if isinstance(values, np.ndarray):
        return values[keep]
    if isinstance(values, CodedStrings):
        return CodedStrings(np.asarray(values.codes)[keep], values.table)
    if isinstance(values, JSONColumn):
        return JSONColumn(subset(values.values, keep))
    return [values[i] for i in keep.tolist()]



def columns_of_rows(rows: list[tuple], rejected: Counter[str]) -> tuple[dict[str, Any], dict[int, dict]]:
    """The rows of ``Sink.activity`` (tuples in the order of :data:`ROW_COLUMNS`, then args) as columns
    for :func:`checked_columns`; a row whose kind or timestamp is not an integer is counted in
    `rejected` and left out."""
    n = len(rows)
    fields = list(zip(*rows, strict=True))
    kinds, cats, names = fields[0], fields[1], fields[2]
    args = {i: a for i, a in enumerate(fields[12]) if a}
    columns: dict[str, Any] = {"name": [as_name(n_) for n_ in names]}
    bad = np.zeros(n, dtype=bool)
    for key, values in zip(_INTEGER_COLUMNS, (kinds, *fields[3:11]), strict=True):
        if set(map(type, values)) <= _INT_TYPES:
            try:
                columns[key] = np.array(values, dtype=np.int64)
                continue
            except OverflowError:  # a value beyond int64: found row by row below
                pass
        col = np.zeros(n, dtype=np.int64)
        for i, v in enumerate(values):  # some value is not a plain int: find which rows
            if v is None:
                continue
            try:
                col[i] = as_int(v)
            except (TypeError, ValueError, OverflowError):
                bad[i] = True
        columns[key] = col
    if all(f is None for f in fields[10]):
        del columns["flow_type"]  # the schema's default
    else:
        given = np.array([f is not None for f in fields[10]])
        columns["flow_type"] = np.where(given, columns["flow_type"], np.where(columns["flow_id"] != 0, FLOW_AC2G, FLOW_NONE))
    columns["flow_start"] = np.array([bool(f) for f in fields[11]], dtype=np.int8)
    if any(c is not None for c in cats):
        columns["cat"] = [c if c is not None else _CATEGORY_BY_INT.get(_kind_or(k), "") for c, k in zip(cats, kinds, strict=True)]
    if bad.any():
        rejected["invalid kind or timestamp (TypeError)"] += int(bad.sum())
        keep = np.flatnonzero(~bad)
        columns = {k: subset(v, keep) for k, v in columns.items()}
        position = {old: new for new, old in enumerate(keep.tolist())}
        args = {position[i]: a for i, a in args.items() if i in position}
    return columns, args


def checked_columns(
    columns: Mapping[str, Any], args: Mapping[int, dict] | None, arg_columns: ArgColumns | None,
    devices: int, resources: Sequence[Resource], rejected: Counter[str], misuse: Callable[[str], Any],
) -> tuple[dict[str, Any], Mapping[int, dict] | None, ArgColumns | None] | None:
    """The rows of `columns` that pass the checks, in the stored form (int64 columns, flows completed,
    categories filled in), with their args: ``(columns, args, arg_columns)``, or None when no row is
    kept. A row that is wrong is counted in `rejected` by reason; a call that cannot be understood (an
    unknown or missing column, lengths that differ, args that are not dicts) goes to `misuse`, which
    raises. `devices` is how many devices the sink has, `resources` its resources."""
    n = _row_count(columns, args, arg_columns, misuse)
    if n == 0:
        return None
    ints: dict[str, np.ndarray] = {}
    ok = np.ones(n, dtype=bool)
    for key in _INTEGER_COLUMNS:
        if key not in columns:
            continue
        values, bad = _int_column(columns[key])
        if values is None:
            rejected[f"{key} is not an integer column ({bad})"] += n
            return None
        if bad is not None and bad.any():  # values beyond int64 (or not integers) in some rows
            rejected[f"{key} not an int64"] += int((bad & ok).sum())
            ok &= ~bad
        ints[key] = values
    for bad, reason in _row_checks(columns, ints, devices, resources):
        bad &= ok
        if bad.any():
            rejected[reason] += int(bad.sum())
            ok &= ~bad
    if ok.any() and resources:
        owner = np.array([r.device for r in resources], dtype=np.int64)
        wrong = ok & (owner[np.clip(ints["resource"], 0, len(owner) - 1)] != ints["device"])
        if wrong.any():
            rejected["resource belongs to another device"] += int(wrong.sum())
            ok &= ~wrong
    keep = None if ok.all() else np.flatnonzero(ok)
    if keep is not None and not len(keep):
        return None
    return _stored(columns, ints, keep, args, arg_columns)


def _row_count(columns: Mapping[str, Any], args: Mapping[int, dict] | None, arg_columns: ArgColumns | None,
               misuse: Callable[[str], Any]) -> int:
    """How many rows the call gives; a call that cannot be understood goes to `misuse`."""
    unknown = set(columns) - set(ROW_COLUMNS)
    if unknown:
        misuse(
            f"unknown column(s) {sorted(unknown)} for sink.activities(); the columns are: "
            f"{', '.join(REQUIRED_COLUMNS)} (required), {', '.join(OPTIONAL_COLUMNS)} (optional)"
        )
    missing = [k for k in REQUIRED_COLUMNS if k not in columns]
    if missing:
        misuse(f"sink.activities() needs the column(s) {missing}")
    lengths = {k: len(v.codes) if isinstance(v, CodedStrings) else len(v) for k, v in columns.items()}
    n = lengths["start"]
    if any(length != n for length in lengths.values()):
        misuse(f"sink.activities(): columns of different lengths {lengths}")
    if arg_columns is not None and (
        len(arg_columns.keys) != len(arg_columns.columns) or any(len(c) != n for c in arg_columns.columns)
    ):
        misuse(
            f"ArgColumns needs one column per key and one value per row ({n} rows); got "
            f"{len(arg_columns.keys)} keys and columns of lengths {[len(c) for c in arg_columns.columns]}"
        )
    if args and any(type(i) is not int or not 0 <= i < n or not isinstance(a, dict) for i, a in args.items()):
        misuse(f"sink.activities(): args must map row numbers 0..{n - 1} to dicts")
    return n


def _row_checks(columns: Mapping[str, Any], ints: dict[str, np.ndarray], devices: int,
                resources: Sequence[Resource]) -> list[tuple[np.ndarray, str]]:
    """Each check of a row's values: (the rows that fail it, the reason counted)."""
    kind, device, resource = ints["kind"], ints["device"], ints["resource"]
    checks = [
        (ints["end"] < ints["start"], "end before start"),
        ((ints["start"] < -HOST_TIME_LIMIT_NS) | (ints["end"] > HOST_TIME_LIMIT_NS),  # (end >= start: checked)
         "timestamp beyond +-2**61 ns (HOST_TIME_LIMIT_NS)"),
        ((device < 0) | (device >= devices), "unknown device"),
        ((resource < 0) | (resource >= len(resources)), "unknown resource"),
        ((kind < 0) | (kind > max(ActivityKind)), "unknown activity kind"),
    ]
    if "flow_type" in ints:
        ftype = ints["flow_type"]
        checks.append(((ftype < _FLOW_TYPES[0]) | (ftype > _FLOW_TYPES[-1]), "unknown flow type"))
    for key in ("name", "cat"):
        values = columns.get(key)
        if isinstance(values, CodedStrings):
            codes = np.asarray(values.codes, dtype=np.int64)
            checks.append(((codes < 0) | (codes >= len(values.table)), f"{key} code outside its string table"))
    return checks


def _stored(columns: Mapping[str, Any], ints: dict[str, np.ndarray], keep: np.ndarray | None,
            args: Mapping[int, dict] | None, arg_columns: ArgColumns | None,
            ) -> tuple[dict[str, Any], Mapping[int, dict] | None, ArgColumns | None]:
    """The kept rows (all when `keep` is None) in the stored form, with their args renumbered."""

    def rows(values: Any) -> Any:
        return values if keep is None else subset(values, keep)

    cols: dict[str, Any] = {k: rows(v) for k, v in ints.items()}
    flow_id = cols.get("flow_id")
    if flow_id is not None:
        has_flow = flow_id != 0
        ftype = cols.get("flow_type")
        cols["flow_type"] = np.where(has_flow, FLOW_AC2G if ftype is None else ftype, FLOW_NONE)
        if "flow_start" in columns:
            cols["flow_start"] = np.where(has_flow, rows(np.asarray(columns["flow_start"])) != 0, False)
    else:
        cols.pop("flow_type", None)
    cols["name"] = rows(columns["name"])
    cats = columns.get("cat")
    cols["cat"] = CodedStrings(cols["kind"], _CATEGORY_TABLE) if cats is None else rows(cats)
    kept_columns = None
    if arg_columns is not None:
        kept_columns = (
            arg_columns if keep is None else ArgColumns(arg_columns.keys, tuple(subset(c, keep) for c in arg_columns.columns))
        )
    kept_args = None
    if args:
        if keep is None:
            kept_args = args
        else:
            position = {old: new for new, old in enumerate(keep.tolist())}
            kept_args = {position[i]: a for i, a in args.items() if i in position}
    return cols, kept_args, kept_columns




def _kind_or(kind: Any) -> int:
    try:
        return as_int(kind)
    except (TypeError, ValueError):
        return -1
