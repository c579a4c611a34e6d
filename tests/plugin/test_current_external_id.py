"""The current External id: the innermost span open in this thread or asyncio task, carried into tasks.
Spans of plain synchronous code leave the context variable alone (the C hot path finds them in the
thread's open-span list); spans inside Context.run (tasks) set it. The cases run with the C hot path
and, in a child process, with the pure-Python one, which sets the variable for every span: both give
the same answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest

import polyprof
from polyprof._native import extension as speedups
from polyprof.plugin.correlation import current, current_external_id


def _scenario() -> dict:
    """Every case, as names: which span's id was current at each checkpoint, and each span's parent."""
    ids: dict[int, str] = {0: "none"}
    seen: dict[str, str] = {}

    span = polyprof.record_function

    def opened(rf):
        ids[rf.open_state[1]] = rf.name
        return rf

    def mark(label):
        seen[label] = ids.get(current_external_id(), f"set {current_external_id()}")

    with polyprof.profile(["cpu"]) as prof:
        mark("before")
        with span("outer") as outer:
            opened(outer)
            mark("in outer")
            with span("inner") as inner:
                opened(inner)
                mark("in inner")
                token = current.set(424242)  # code that makes an id current itself (a test, a framework)
                ids[424242] = "set by the caller"
                mark("after a set")
                with span("under the set") as under:
                    opened(under)
                    mark("in a span under the set")
                mark("after that span")
                current.reset(token)
                mark("after the reset")
            mark("back in outer")

            async def task(n):
                mark(f"task {n} starts")
                with span(f"task span {n}") as s:
                    opened(s)
                    await asyncio.sleep(0.005 * n)
                    mark(f"task {n} after its sleep")

                    async def child():
                        return current_external_id()

                    made = asyncio.create_task(child())  # a copy of the task's context now
                    with span(f"later in task {n}") as later:
                        opened(later)
                        got = await made
                        seen[f"child of task {n}"] = ids.get(got, str(got))
                mark(f"task {n} ends")

            async def main():
                await asyncio.gather(task(1), task(2))

            asyncio.run(main())
            mark("after asyncio.run")

            def generator():
                with span("generator") as g:
                    opened(g)
                    yield
                    mark("generator resumed")
                    yield

            gen = generator()
            next(gen)
            mark("generator suspended")
            with span("beside the generator") as beside:
                opened(beside)
                next(gen)  # the generator's span is below this one: closed out of order, later
                mark("after resuming it")
            mark("after the span beside it")
            next(gen, None)
            mark("generator done")

            other: list[str] = []
            t = threading.Thread(target=lambda: other.append(ids.get(current_external_id(), "?")))
            t.start()
            t.join()
            seen["another thread"] = other[0]
        mark("after outer")
    return {"seen": seen, "spans": sorted(a.name for a in prof.trace.activities)}


EXPECTED_SEEN = {
    "before": "none",
    "in outer": "outer",
    "in inner": "inner",
    "after a set": "set by the caller",
    "in a span under the set": "under the set",
    "after that span": "set by the caller",
    "after the reset": "inner",
    "back in outer": "outer",
    "task 1 starts": "outer",
    "task 2 starts": "outer",
    "task 1 after its sleep": "task span 1",
    "task 2 after its sleep": "task span 2",
    "child of task 1": "task span 1",
    "child of task 2": "task span 2",
    "task 1 ends": "outer",
    "task 2 ends": "outer",
    "after asyncio.run": "outer",
    "generator suspended": "generator",
    "generator resumed": "beside the generator",
    "after resuming it": "beside the generator",
    "after the span beside it": "generator",
    "generator done": "outer",
    "another thread": "none",
    "after outer": "none",
}


def test_the_current_id_is_the_innermost_span_of_the_thread_or_task():
    got = _scenario()
    assert got["seen"] == EXPECTED_SEEN


@pytest.mark.skipif(speedups is None, reason="the C extension is not built here, so there is nothing to compare")
def test_the_c_and_python_hot_paths_agree_and_the_c_one_skips_the_variable():
    assert speedups.thread_context_fast(), "CPython's context layout should be the one checked for"
    path = os.pathsep.join(p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "POLYPROF_PURE_PYTHON": "1", "PYTHONPATH": path}
    code = "import json, test_current_external_id as t; print(json.dumps(t._scenario()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == _scenario()


@pytest.mark.skipif(speedups is None, reason="the C reader exists only with the C extension")
def test_the_c_reader_gives_the_same_id():
    import ctypes

    from polyprof.plugin import external_id_reader

    reader = ctypes.PYFUNCTYPE(ctypes.c_longlong)(external_id_reader())
    with polyprof.profile(["cpu"]):
        with polyprof.record_function("x") as x:
            assert reader() == current_external_id() == x.open_state[1]
        assert reader() == 0


def test_a_thread_that_asked_before_it_had_spans_finds_its_first_span():
    """A launching thread asks for the id before it records anything (no buffer yet: the C reader
    remembers that); its first span must still be found, and a later thread starts from none again."""
    seen: list[tuple[int, int]] = []

    def thread() -> None:
        before = current_external_id()
        with polyprof.record_function("first") as first:
            seen.append((before, current_external_id() - first.open_state[1]))

    with polyprof.profile(["cpu"]):
        for _ in range(3):
            t = threading.Thread(target=thread)
            t.start()
            t.join()
    assert seen == [(0, 0)] * 3
