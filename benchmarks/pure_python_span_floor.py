"""How cheap a pure-Python span can be: stripped-down spans beside polyprof's, in one process.

    POLYPROF_PURE_PYTHON=1 .venv/bin/python benchmarks/pure_python_span_floor.py [--n 50000] [--rounds 15]
    POLYPROF_PURE_PYTHON=1 .venv/bin/python benchmarks/pure_python_span_floor.py --instructions [--n 20000]

Issue #21 asks the pure-Python `record_function` for at most 1/10 of torch.profiler's cost. Each
variant below adds one part of what a span needs, down to polyprof's own (the twin `RecordFunction`); all are
timed as `with Span("x"): pass` while a polyprof profile records, and torch.profiler's
`record_function` while torch's records, in alternating batches (so that this machine's drift hits
them alike); reported as the fastest and the median batch, and as ratios to torch's. One variant,
`no_instance_state_in_contextvar`, leaves the ladder: no instance at all (one shared object a name),
for what the instance and its `__init__` cost in a span that keeps a current id. With
``--instructions``, each variant's instructions a span instead, counted by callgrind as
``instruction_counts.py`` counts (torch's: ``instruction_counts.py --torch``).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import threading
import time
from asyncio import _get_running_loop
from contextvars import ContextVar, Token
from typing import Any

from _common import report

import polyprof
from polyprof import annotations
from polyprof._native import extension as speedups
from polyprof._native.twins import recorder as twin

_clock = time.perf_counter_ns
_new_id = itertools.count(1).__next__
_current: ContextVar[int] = ContextVar("floor_current", default=0)
_current_get, _current_set, _current_reset = _current.get, _current.set, _current.reset
_node: ContextVar[tuple | None] = ContextVar("floor_node", default=None)  # _SharedSpan's
_node_get, _node_set = _node.get, _node.set
_unset = Token.MISSING  # a token's old_value where the variable was not set
_SPAN, _OPEN, _STRIDE = twin.SPAN, twin.OPEN, twin.STRIDE  # polyprof's event layout
_thread = threading.local()
_thread.events = []
_events: list = []


class _ThreadState:
    """A thread's events and its innermost span of plain synchronous code (LazyCurrentSpan's)."""

    __slots__ = ("events", "own", "seen")

    def __init__(self) -> None:
        self.events: list = []
        self.own, self.seen = 0, None


_thread.state = _ThreadState()


class EmptySpan:
    """The `with` itself: an instance, `__enter__` and `__exit__` that do nothing."""

    __slots__ = ("name", "args")

    def __init__(self, name: str, args: Any = None) -> None:
        self.name, self.args = name, args

    def __enter__(self) -> EmptySpan:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        pass


class TimedSpan(EmptySpan):
    """+ two clock reads, one event written at exit (no id, thread buffer or parent)."""

    __slots__ = ("start",)

    def __enter__(self) -> TimedSpan:
        self.start = _clock()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _events.extend((0, self.start, _clock(), 0, 0, self.name, self.args))


class IdentifiedSpan(EmptySpan):
    """+ the thread's buffer and an id; written at entry, its end at exit (as polyprof's, so a flush
    can see it open). No parent, and nothing made the current External id."""

    __slots__ = ("_events", "_end_at")

    def __enter__(self) -> IdentifiedSpan:
        events = self._events = _thread.events
        events.extend((0, _clock(), None, _new_id(), 0, self.name, self.args))
        self._end_at = len(events) - 5
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._events[self._end_at] = _clock()


class CurrentSpan(IdentifiedSpan):
    """+ the id made current through a context variable (right per thread and asyncio task), the
    parent from its token."""

    __slots__ = ("_token",)

    def __enter__(self) -> CurrentSpan:
        i = _new_id()
        token = self._token = _current_set(i)
        parent = token.old_value
        events = self._events = _thread.events
        events.extend((0, _clock(), None, i, 0 if parent is _unset else parent, self.name, self.args))
        self._end_at = len(events) - 5
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._events[self._end_at] = _clock()
        _current_reset(self._token)


class LazyCurrentSpan(IdentifiedSpan):
    """+ the id made current as the C path makes it, as lean as Python allows: no event loop running on
    the thread (plain synchronous code), the variable is left alone and the thread's state keeps the
    innermost such span and the variable's value when it opened (newer if it changed since); inside an
    event loop, the variable. Not polyprof's semantics in every case (Python cannot tell a
    `Context.run` outside asyncio), measured for its cost."""

    __slots__ = ("_state", "_previous", "_token")

    def __enter__(self) -> LazyCurrentSpan:
        state = self._state = _thread.state
        i = _new_id()
        value = _current_get()
        if _get_running_loop() is None:
            own = state.own
            parent = own if own and value is state.seen else value
            self._previous, self._token = (own, state.seen), None
            state.own, state.seen = i, value
        else:
            parent = value or state.own
            self._token = _current_set(i)
        events = self._events = state.events
        events.extend((0, _clock(), None, i, parent, self.name, self.args))
        self._end_at = len(events) - 5
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._events[self._end_at] = _clock()
        if self._token is None:
            self._state.own, self._state.seen = self._previous
        else:
            _current_reset(self._token)


class _SharedSpan:
    """One shared object per name (what :data:`shared_span` hands out): every span's state lives in a
    context variable, as a node (id, event list, where its end goes, the enclosing node)."""

    __slots__ = ("name", "args")

    def __enter__(self) -> _SharedSpan:
        i = _new_id()
        node = _node_get()
        events = _thread.events
        events.extend((0, _clock(), None, i, node[0] if node is not None else 0, self.name, self.args))
        _node_set((i, events, len(events) - 5, node))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _, events, end_at, enclosing = _node_get()
        events[end_at] = _clock()
        _node_set(enclosing)


class _SharedSpans(dict):
    def __missing__(self, name: str) -> _SharedSpan:
        span = self[name] = _SharedSpan()
        span.name, span.args = name, None
        return span


#: No instance a span: `shared_span("x")` is a dict lookup (a C call), its state a context variable's
#: node. Not an API polyprof could ship (no `args=` keyword, no state on the object, one object for
#: every span of a name), measured for what dropping the instance and `__init__` would buy.
shared_span = _SharedSpans().__getitem__


class LeanestPolyprofSpan(EmptySpan):
    """polyprof's own span with its checks as lean as they go: one flag for recording with no framework
    bridge and no correlation targets (polyprof's other cases left out), the parent from the token, the
    recorder's thread buffer, and the end written only where a flush has not taken the event's list."""

    __slots__ = ("_events", "_at", "_buf", "_token")

    def __init__(self, name: str, args: Any = None) -> None:
        self.name, self.args, self._events = name, args, None

    def __enter__(self) -> LeanestPolyprofSpan:
        if twin._plain:
            i = _new_id()
            token = self._token = twin._current_set(i)
            parent = token.old_value
            try:
                buf = twin._local.events
            except AttributeError:
                buf = annotations.recorder.buffer()
            self._buf = buf
            events = buf.events
            events.extend((_SPAN, _clock(), _OPEN, i, 0 if parent is _unset else parent, self.name, self.args))
            self._at = len(events) - _STRIDE
            self._events = events
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        events = self._events
        if events is not None:
            end = _clock()
            self._events = None
            twin._current_reset(self._token)
            if events is self._buf.events:
                events[self._at + 2] = end


VARIANTS = {
    "empty_with": EmptySpan,
    "clocks_and_event": TimedSpan,
    "thread_buffer_and_id": IdentifiedSpan,
    "current_id_contextvar": CurrentSpan,
    "current_id_lazy_as_in_c": LazyCurrentSpan,
    "no_instance_state_in_contextvar": shared_span,
    "polyprof_checks_leanest": LeanestPolyprofSpan,
    "polyprof_pure_python": twin.RecordFunction,
}


def timed(span: Any, n: int) -> float:
    start = _clock()
    for _ in range(n):
        with span("x"):
            pass
    return (_clock() - start) / n


def instructions(n: int) -> None:
    """Each variant's instructions a span while polyprof records (callgrind, N and 2N spans)."""
    from instruction_counts import QUIT_NOW, per_iteration

    here = os.path.dirname(os.path.abspath(__file__))
    counts = {}
    for name in ["empty_loop", *VARIANTS]:
        setup = (f"import sys; sys.path.insert(0, {here!r}); import pure_python_span_floor as floor; "
                 f"span = floor.VARIANTS.get({name!r}); p = polyprof.profile(['cpu'], flush_interval_s=None); "
                 "p.__enter__()")
        body = "pass" if name == "empty_loop" else "with span('x'): pass"
        counts[name] = round(per_iteration(setup, body, n, QUIT_NOW), 1)
    report("pure_python_span_floor", {"n": n, "instructions_per_span": counts})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--instructions", action="store_true", help="instructions a span (callgrind), not time")
    args = ap.parse_args()
    if speedups is not None:
        raise SystemExit("this compares pure-Python spans: run it with POLYPROF_PURE_PYTHON=1 in the environment")
    if args.instructions:
        return instructions(args.n)
    try:
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        profile = None
    else:  # polyprof's spans as before torch is imported: no torch-side consumer to ask about
        annotations.set_framework_bridge(None)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    torch_samples: list[float] = []
    torch_n = max(args.n // 10, 1000)
    gc.collect()
    for _ in range(args.rounds):
        with polyprof.profile(["cpu"], flush_interval_s=None):
            for name, span in VARIANTS.items():
                _events.clear()  # every batch starts with empty buffers, polyprof's too
                _thread.events = []
                annotations.recorder.take()
                samples[name].append(timed(span, args.n))
        if profile is not None:
            with profile(activities=[ProfilerActivity.CPU]):
                torch_samples.append(timed(record_function, torch_n))
    results: dict[str, Any] = {"n_per_batch": args.n, "rounds": args.rounds}
    for name, values in [*samples.items(), ("torch_record_function", torch_samples)]:
        if values:
            results[f"{name}_ns"] = {"fastest": round(min(values), 1), "median": round(statistics.median(values), 1)}
    if torch_samples:
        results["over_torch"] = {
            name: {"fastest": round(min(v) / min(torch_samples), 3), "median": round(statistics.median(v) / statistics.median(torch_samples), 3)}
            for name, v in samples.items()
        }
    else:
        results["torch"] = "not installed"
    report("pure_python_span_floor", results)


if __name__ == "__main__":
    main()
