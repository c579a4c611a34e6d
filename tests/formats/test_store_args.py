"""A rank's args as the store's JSON columns (polyprof.formats.store.rank_args): every row's columns say what
``args[row]`` says, shapes apart from the rest, in C and in the row-by-row Python alike."""

import json

import numpy as np
import orjson
import pytest

import polyprof._native
from polyprof.formats.store import rank_args
from polyprof.formats.store.rank_args import COLLECTIVE_KEY, SHAPE_ARGS, args_columns
from polyprof.model import ArgColumns, JSONColumn
from polyprof.model.args import Args


def _args(seed=3, n=400):
    """Blocks of every column kind (int, float with NaN, strings, lists, None, JSON text with rows that
    lack the key, shapes as JSON text and as lists), rows in a block and a dict (merged), dict-only
    rows, and collectives in a block and in a dict."""
    rng = np.random.default_rng(seed)
    args = Args()
    rows = np.arange(0, n, 2, dtype=np.int64)
    k = len(rows)
    floats = rng.random(k) * 1e17
    floats[::7] = np.nan
    dims = [b"[[4,4],[]]" if i % 3 else b"" for i in range(k)]
    args.add_block(rows, ArgColumns(
        ("stream", "ratio", "label", "grid", "maybe", "Input Dims", "json"),
        (rng.integers(-5, 2**40, k), floats, [f'q"{i}\u00e9' for i in range(k)], [[i, [1, 2]] for i in range(k)],
         [None if i % 2 else i for i in range(k)], JSONColumn(dims),
         JSONColumn([b'{"a":[1,2]}' if i % 4 else b"" for i in range(k)]))))
    odd = np.arange(1, n, 4, dtype=np.int64)
    args.add_block(odd, ArgColumns(
        ("Input type", COLLECTIVE_KEY, "Process Group Name"),
        ([["float", ""]] * len(odd), ["allreduce" if i % 5 == 0 else None for i in range(len(odd))],
         ["0"] * len(odd))))
    for row in range(0, n, 10):  # in a block too: merged
        args.dicts[row] = {"extra": row, "Input type": ["int"]}
    args.dicts[n + 1] = {COLLECTIVE_KEY: "broadcast", "Input Dims": [[1]]}
    args.dicts[n + 2] = {}
    sparse = np.arange(n + 3, n + 9, dtype=np.int64)  # rows with no key but the shapes, or none
    args.add_block(sparse, ArgColumns(("Input Dims", "sparse"), (JSONColumn([b"[]"] * 6),
                                                                 JSONColumn([b"", b"1", b"", b"", b"", b""]))))
    return args, n + 9


def _check(args, n, out):
    for row in range(n):
        values = dict(args[row]) if row in args.rows() else {}
        for key, column in SHAPE_ARGS.items():
            text = getattr(out, column)[row]
            assert (json.loads(text) if text is not None else None) == values.pop(key, None), (row, key)
        text = out.other[row]
        assert (text is None) == (not values), row  # no args left: null, not {}
        assert (json.loads(text) if text is not None else {}) == orjson.loads(orjson.dumps(values, default=str)), row
    assert out.collective == {r: dict(args[r]) for r in args.rows().tolist()
                              if args[r].get(COLLECTIVE_KEY) is not None}


@pytest.mark.parametrize("path", ["c", "python"])
def test_every_rows_columns_say_what_its_args_say(path, monkeypatch):
    if path == "c" and polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension")
    if path == "python":
        from polyprof._native.twins.writers import format_arg_objects

        monkeypatch.setattr(rank_args._native, "format_arg_objects", format_arg_objects)  # the twin, as without C
    args, n = _args()
    out = args_columns(args, n)
    assert out.collective and any(t is not None for t in out.input_dims)
    _check(args, n, out)
