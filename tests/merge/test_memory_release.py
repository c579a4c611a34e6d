"""A trace's memory goes back to the system after the trace is collected: the release is marked due by
its finalizer and done at the end of the next garbage collection, never at interpreter exit."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import polyprof
from polyprof.merge import memory


class _Owner:
    """Something that holds a trace in a reference cycle (a user's object; a profile is in none)."""

    def __init__(self, payload):
        self.payload, self.me = payload, self


@pytest.mark.skipif(memory._trim is None, reason="needs glibc's malloc_trim (Linux)")
def test_the_release_waits_for_the_collection_that_frees_the_owner(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(memory, "RELEASE_MIN_ROWS", 1)
    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function("x"):
            pass
    owner = _Owner(prof.trace)
    del prof
    gc.collect()
    calls.clear()
    del owner
    assert calls == [], "nothing yet: the owner sits in a cycle"
    gc.collect()
    assert calls == [0], "released once the collection freed the trace and its owner"
    gc.collect()
    assert calls == [0], "once per trace"


def test_a_program_that_exits_with_a_trace_alive_exits_at_once():
    code = (
        "import polyprof, polyprof.merge.memory\npolyprof.merge.memory.RELEASE_MIN_ROWS = 1\n"
        "with polyprof.profile(['cpu']) as p:\n    polyprof.instant('x')\nkeep = p.trace\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(memory._trim is None, reason="needs glibc's malloc_trim (Linux)")
def test_only_a_trace_of_release_min_rows_or_more_asks_for_the_release(monkeypatch):
    """A trim gives back every free page of the heap, the program's too, and they fault in again: after
    a small window that costs more than it frees."""
    calls = []
    monkeypatch.setattr(memory, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(memory, "RELEASE_MIN_ROWS", 3)
    for rows, expected in ((2, []), (3, [0])):
        calls.clear()
        with polyprof.profile(["cpu"]) as prof:
            for _ in range(rows):
                polyprof.instant("x")
        assert len(prof.trace.activities) == rows
        del prof
        gc.collect()
        assert calls == expected, f"a trace of {rows} rows"
