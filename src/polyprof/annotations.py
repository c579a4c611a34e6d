"""Host annotations: ``record_function``, instant events and user counters.

This is the API users call; the built-in ``host`` backend turns what it records into activities.
Outside a profile each call costs one flag check. While profiling, each thread appends to its own
buffer (no locks on the hot path)::

    import polyprof

    with polyprof.record_function("load batch"):
        ...

    @polyprof.record_function("train step")
    def step(batch): ...

    @polyprof.record_function("fetch")
    async def fetch(url): ...      # the span covers the whole awaited call

    polyprof.instant("checkpoint saved", {"path": "ckpt.pt"})
    polyprof.counter("queue depth", 17)

The hot path is the recorder of :mod:`polyprof._native`: C where polyprof's extension is in use,
its Python twin otherwise; both record the same events, but for a decorated function called with
arguments that do not fit its parameters: the C wrapper raises the TypeError inside the call's span,
the Python one (where it takes the function's own parameters) before the span opens.

When a framework-side consumer listens (torch's profiler, an ExecutionTraceObserver), each
``record_function`` is also that framework's own range, so the consumer sees polyprof's annotations;
the torch backend installs that bridge (:func:`set_framework_bridge`). Otherwise it stays on the fast
path.
"""

from __future__ import annotations

import functools
import json
import threading
import weakref
from typing import Any

from polyprof import _native
from polyprof._native import COUNTER, FIELDS, GC, INSTANT, SPAN, Routed, open_states, snapshot
from polyprof.plugin import correlation

__all__ = ["COUNTER", "FIELDS", "GC", "INSTANT", "SPAN", "FrameworkBridge", "counter", "instant",
           "open_states", "record_function", "recorder", "set_framework_bridge", "snapshot"]


def args_text(args: Any) -> str | None:
    """A span's args as the one string input a framework range takes (torch's record_function args)."""
    if args is None or isinstance(args, str):
        return args
    try:
        return json.dumps(args, default=repr)
    except (TypeError, ValueError):
        return repr(args)


class FrameworkBridge:
    """What :func:`set_framework_bridge` takes: ``consumers()`` (is a framework-side consumer
    listening on this thread?), ``enter(name, args_text) -> (range, handle)`` and ``exit(range)`` for the
    pure-Python path, and the C addresses of the same three functions (0 if there are none) for the C
    one."""

    c_addresses: tuple[int, int, int] = (0, 0, 0)

    def consumers(self) -> bool:
        return False

    def enter(self, name: str, text: str | None) -> tuple[Any, int]:
        return None, 0

    def exit(self, rng: Any) -> None:
        pass


def set_framework_bridge(bridge: FrameworkBridge | None) -> None:
    """Install (or, with None, remove) the bridge to a framework's own ranges."""
    _native.set_bridge(bridge, Routed, args_text)


class ThreadBuffer:
    """A thread's buffer plus what identifies the thread on the timeline."""

    __slots__ = ("tid", "name", "events", "thread")

    def __init__(self, thread: threading.Thread | None, events: Any) -> None:
        self.tid = threading.get_native_id()
        self.name = thread.name if thread is not None else ""
        self.events = events
        self.thread = weakref.ref(thread) if thread is not None else lambda: None

    def taken(self) -> ThreadBuffer:
        out = ThreadBuffer(None, self.events.take())
        out.tid, out.name = self.tid, self.name
        return out


class Recorder:
    """Global recording state. Only one profile records at a time (like torch.profiler)."""

    def __init__(self) -> None:
        self.active = False
        self._lock = threading.Lock()
        self._buffers: list[ThreadBuffer] = []

    def buffer(self) -> Any:
        """The calling thread's event buffer (registered on first use)."""
        return _native.thread_buffer()

    def register(self, events: Any) -> None:
        """Remember a new thread's buffer (called once per thread, from that thread)."""
        buf = ThreadBuffer(threading.current_thread(), events)
        with self._lock:
            self._buffers.append(buf)

    def begin(self) -> None:
        with self._lock:
            # buffers of ended threads are dropped; live ones are emptied in place, since their
            # threads keep using the same buffer object
            self._buffers = [b for b in self._buffers if (t := b.thread()) is not None and t.is_alive()]
            for b in self._buffers:
                b.events.clear()
        self.active = True
        _native.set_active(True)

    def end(self) -> None:
        self.active = False
        _native.set_active(False)

    def buffers(self) -> list[ThreadBuffer]:
        with self._lock:
            return list(self._buffers)

    def take(self) -> list[ThreadBuffer]:
        """Every thread's events so far, moved out of the threads' buffers (which are left empty and
        keep no memory), as ThreadBuffers of their own: what a recording hands over at its end."""
        with self._lock:
            return [b.taken() for b in self._buffers]


recorder = Recorder()


def _decorate(self: Any, fn: Any) -> Any:
    """``@record_function(name)``: a fresh span per call (so recursion and concurrency are safe)."""
    cls, name, args = type(self), self.name, self.args
    import inspect  # here: only decorating needs it (~4 ms at import otherwise)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*a: Any, **kw: Any) -> Any:
            with cls(name, args):
                return await fn(*a, **kw)

        return async_wrapper

    if cls is _native.RecordFunction:  # each call a span, inline (a subclass goes the `with` way: it
        return functools.update_wrapper(_native.SpanCall(fn, name, args), fn)  # may override __enter__)

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        with cls(name, args):
            return fn(*a, **kw)

    return wrapper


_DOC = """A named span on the host timeline (`user_annotation`), usable as context manager or decorator.

    While it is open, device work launched from this thread/task gets its id as `External id`.
    `args` is a string (as in torch) or a dict of JSON-serialisable values.
    """

_native.configure(
    correlation.current, recorder.register, correlation.push, correlation.pop, correlation.KIND_ANNOTATION,
    _decorate, _DOC,
)
#: the recorder's type itself (C or its Python twin): no subclass to go through
record_function = _native.RecordFunction
instant = _native.instant
counter = _native.counter
