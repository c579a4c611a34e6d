"""The merge's C walks (csrc/merge_passes.c) and their numpy twins give the same answers, on random
input with a fixed seed; bad input to the C functions is refused with what was wrong."""

from __future__ import annotations

import numpy as np
import pytest
from native_sides import use_python_side

import polyprof._native
from polyprof.merge import _positions, _take_two
from polyprof.merge.attribution import in_order
from polyprof.merge.lookup import lookup
from polyprof.merge.order import start_order

fast = polyprof._native.extension
needs_c = pytest.mark.skipif(fast is None, reason="needs polyprof's C extension (built by setup.sh)")


def _both(monkeypatch, fn, *args):
    c = fn(*args)
    with monkeypatch.context() as m:
        use_python_side(m)
        py = fn(*args)
    return c, py


@needs_c
def test_take_two_is_a_gather_from_the_concatenation(monkeypatch):
    rng = np.random.default_rng(11)
    for dtype in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64):
        a, b = rng.integers(0, 100, 50).astype(dtype), rng.integers(0, 100, 7).astype(dtype)
        source = rng.integers(0, 57, 200)
        c, py = _both(monkeypatch, _take_two, a, b, source)
        assert c.dtype == py.dtype == dtype
        assert np.array_equal(c, py)
        assert np.array_equal(c, np.concatenate((a, b))[source])


@needs_c
def test_rows_in_order_and_interleaving_match_numpy(monkeypatch):
    rng = np.random.default_rng(12)
    for _ in range(100):
        n, m = int(rng.integers(0, 200)), int(rng.integers(0, 60))
        start = rng.integers(0, 50, n)
        end = start + rng.integers(0, 20, n)
        order = start_order(start, end)
        order = np.arange(n, dtype=np.int64) if order is None else order
        mask = rng.random(n) < 0.4
        c, py = _both(monkeypatch, in_order, order, mask)
        assert np.array_equal(c, py)
        a_start = rng.integers(0, 50, m)
        a_end = a_start + rng.integers(0, 20, m)
        a_order = start_order(a_start, a_end)
        if a_order is not None:
            a_start, a_end = a_start[a_order], a_end[a_order]
        (ce, ca), (pe, pa) = _both(monkeypatch, _positions, start[order], end[order], a_start, a_end)
        assert np.array_equal(ce, pe) and np.array_equal(ca, pa)
        assert sorted([*ce, *ca]) == list(range(n + m)), "every final position once"


@needs_c
def test_interleaving_rows_out_of_order_falls_back_to_the_search():
    start, end = np.array([5, 1]), np.array([6, 2])  # not in order: the C walk declines
    existing_at, added_at = np.empty(2, np.int64), np.empty(1, np.int64)
    assert not fast.interleave_ordered(start, end, np.array([3]), np.array([4]), existing_at, added_at)


def test_lookup_finds_the_first_equal_key_dense_or_sparse():
    rng = np.random.default_rng(13)
    for scale in (1, 10**12):  # dense ids use a table, sparse ones a sorted search
        keys = rng.permutation(1000)[:600] * scale + 7
        values = rng.integers(0, 10**9, len(keys))
        queries = np.concatenate((rng.choice(keys, 300), keys.max() + scale * np.arange(1, 20), [-5, 0]))
        got = lookup(keys, values, queries)
        expected = {int(k): int(v) for k, v in zip(keys, values, strict=True)}
        assert got.tolist() == [expected.get(int(q), -1) for q in queries]
    repeated = np.array([4, 9, 4, 2])  # a repeated key: the first one's value, as a stable sort gives
    assert lookup(repeated, np.array([10, 20, 30, 40]), np.array([4, 2, 3])).tolist() == [10, 40, -1]
    assert lookup(np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([1])).tolist() == [-1]


@needs_c
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fast.take_two(np.zeros(3), np.zeros(2, np.int32), np.zeros(1, np.int64), np.zeros(1)), "one item size"),
        (lambda: fast.take_two(np.zeros(3), np.zeros(2), np.array([7]), np.zeros(1)), "outside first and second"),
        (lambda: fast.ordered_rows(np.array([5]), np.zeros(2, bool)), "outside the mask's rows"),
        (lambda: fast.innermost_open(*(np.zeros(3, np.int64),) * 2, np.full(3, -1, np.int32),
                                     *(np.zeros(1, np.int64),) * 3), "thread codes must be >= 0"),
        (lambda: fast.innermost_open(*(np.zeros(3, np.int64),) * 2, np.zeros(3, np.int32), np.array([9]),
                                     *(np.zeros(1, np.int64),) * 2), "span index is outside"),
    ],
)
def test_c_passes_refuse_bad_input_with_the_reason(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
