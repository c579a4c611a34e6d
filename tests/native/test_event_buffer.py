"""The C EventBuffer (24 bytes per event, names and args beside) gives back exactly what its pure-Python
twin does, for the values the compact layout keeps outside its rows: durations past 4.3 s or negative,
ids and parents 2^31 or more from their chunk's base (the process's next id when the chunk began) or
at the edges of that range, names repeated as one object or as equal strings, unhashable names, args on
a few rows, take() while events keep coming, rows across the chunks (8,192 rows each) the buffer keeps
them in."""

from __future__ import annotations

import random

import numpy as np
import pytest

import polyprof._native
from polyprof._native.twins.recorder import EventBuffer as PyEventBuffer
from polyprof.annotations import snapshot

fast = polyprof._native.extension
needs_c = pytest.mark.skipif(fast is None, reason="needs polyprof's C extension (built by setup.sh)")


def _same(c, py):
    rows_c, names_c, args_c = snapshot(c)
    rows_p, names_p, args_p = snapshot(py)
    assert np.array_equal(np.asarray(rows_c), np.asarray(rows_p))
    assert names_c == names_p and args_c == args_p
    return len(rows_c)


@needs_c
def test_random_events_round_trip_as_the_python_twin_keeps_them():
    rng = random.Random(21)
    shared = "step"  # one object, the usual case
    names = [shared, "step", "a" * 40, ["unhashable"], 7, "zéro"] + [f"n{i}" for i in range(200)]
    c, py = fast.EventBuffer(), PyEventBuffer()
    seen = 0

    def an_id() -> int:  # mostly near the next id, as spans' ids are; the edges of a 32-bit offset; far ones
        near = fast.next_id()  # (and the next chunk's base moves on)
        return rng.choice([near - rng.randrange(5000), near - rng.randrange(5000), 0, near - 2**31 + 1,
                           near - 2**31 + 2, near + 2**31 - 2, near + 2**31 - 1, near + 2**31,
                           rng.randrange(2**62), -7, -(2**63), 2**63 - 1])

    for i in range(40_000):
        start = rng.randrange(0, 2**40)
        dur = rng.choice([0, 5, 1000, 2**32 - 2, 2**32 - 1, 2**32, 10**12, -3])
        event = (rng.choice([0, 1, 2]), start, start + dur, rng.choice(names), an_id(), an_id(),
                 rng.choice([None] * 9 + [{"i": i}, "text"]))
        c.add(*event)
        py.add(*event)
        if i in (8_191, 24_576):  # hand over part way, as a flush does (a chunk just full; three chunks)
            seen += _same(c.take(), py.take())
    seen += _same(c, py)
    assert seen == 40_000 and len(c) == len(py) == 40_000 - 24_577


@needs_c
def test_ids_at_the_edges_of_a_rows_offset_from_its_chunks_base():
    c, py = fast.EventBuffer(), PyEventBuffer()
    edges = [-(2**31), -(2**31) + 1, -(2**31) + 2, -1, 0, 1, 2**31 - 1, 2**31]
    for _ in range(3):  # three chunks, each with its own base
        base = fast.next_id() + 1  # the process's next id, which the chunk begun by the next row takes
        for k in range(8192):
            ident = base + edges[k % len(edges)] if k < 64 else base - k
            parent = base + edges[(k // len(edges)) % len(edges)] if k < 64 else 0
            c.add(0, k, k + 1, "x", ident, parent, None)
            py.add(0, k, k + 1, "x", ident, parent, None)
    assert _same(c, py) == 3 * 8192


@needs_c
def test_many_distinct_names_and_a_cleared_buffer():
    c = fast.EventBuffer()
    for i in range(70_000):
        c.add(0, i, i + 1, f"name {i}", i, 0, None)
    rows, names, _ = snapshot(c)
    assert names[69_999] == "name 69999" and rows[69_999].tolist() == [0, 69_999, 70_000, 69_999, 0]
    c.clear()
    assert len(c) == 0 and snapshot(c)[1] == []


def test_instant_and_counter_take_their_arguments_by_name_too():
    """(The recorder chosen at import: the suite's run without the extension takes the Python twin's.)"""
    import polyprof

    instant, counter = polyprof.instant, polyprof.counter
    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function("outer"):
            instant("a")
            instant("b", {"k": 1})
            instant(name="c", args={"k": 2})
        counter("depth", 3)
        counter(name="width", value=4.5)
    acts = {a.name: a for a in prof.trace.activities}
    assert acts["b"].args == {"k": 1} and acts["c"].args == {"k": 2}
    assert acts["a"].external_id == acts["outer"].correlation, "an instant points at the span open around it"
    assert [(s.name, s.value) for s in prof.trace.counters.samples] == [("depth", 3.0), ("width", 4.5)]
    with pytest.raises(TypeError):
        instant()
    with pytest.raises(TypeError):
        counter("only a name")


@needs_c
@pytest.mark.filterwarnings("ignore:polyprof backend 'host'")  # the string and None, refused at collect
def test_counter_values_kept_in_the_row_come_back_as_they_were_given():
    """A float or an int that fits is kept in the counter's row (no args entry); snapshot() gives the
    value back with its type; any other value (a bool, an int past 64 bits, a string) is kept beside,
    the object itself, as the Python twin keeps every value."""
    import math

    from polyprof import annotations

    values = [1.5, -0.0, math.inf, math.nan, 3, -(2**63), 2**63 - 1, 2**63, -(2**70), True, "x", None]
    with polyprof.profile(["cpu"]):
        for v in values:
            fast.counter("c", v)
        rows, names, args = snapshot(annotations.recorder.buffer())
    assert rows[:, 0].tolist() == [annotations.COUNTER] * len(values) and not rows[:, 3].any()
    assert names == ["c"] * len(values)
    for given, back in zip(values, args, strict=True):
        assert type(back) is type(given), (given, back)
        assert back is given or back == given or (math.isnan(given) and math.isnan(back))
    assert math.copysign(1.0, args[1]) == -1.0  # the sign of -0.0 kept
    assert args[9] is True and args[10] == "x" and args[11] is None


@needs_c
def test_the_buffers_own_row_types_are_refused_from_python():
    with pytest.raises(ValueError, match="from 0 to 239"):
        fast.EventBuffer().add(240, 0, 1, "x", 0, 0, None)
