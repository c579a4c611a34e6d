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

The hot path is implemented in C (``polyprof._speedups``) when that extension is built, and in
Python otherwise; both record the same events, but for a decorated function called with arguments
that do not fit its parameters: the C wrapper raises the TypeError inside the call's span, the Python
one (where it takes the function's own parameters) before the span opens.

When a framework-side consumer listens (torch's profiler, an ExecutionTraceObserver), each
``record_function`` is also that framework's own range, so the consumer sees polyprof's annotations;
the torch backend installs that bridge (:func:`set_framework_bridge`). Otherwise it stays on the fast
path.
"""

from __future__ import annotations

import functools
import json
import linecache
import threading
import types
import weakref
from typing import Any, NamedTuple

from polyprof import correlation
from polyprof._accel import speedups
from polyprof.clock import host_ns
from polyprof.forwarding import signature_source

# Event types stored in a buffer's first column.
SPAN = 0
INSTANT = 1
COUNTER = 2
GC = 3  # a garbage collection (recorded by the host backend with record_python_gc_info)
FIELDS = 5  # type, start, end, id, parent
_STRIDE = FIELDS + 2  # and name, args: one event in a PyEventBuffer


class Routed(NamedTuple):
    """The buffered args of a span that was also a framework range: the user's args and the range's
    handle (torch's "Record function id")."""

    args: Any
    handle: int


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


_bridge: FrameworkBridge | None = None


def set_framework_bridge(bridge: FrameworkBridge | None) -> None:
    """Install (or, with None, remove) the bridge to a framework's own ranges."""
    global _bridge
    _bridge = bridge
    _refresh_plain()
    if speedups is not None:
        consumers, enter, exit_ = bridge.c_addresses if bridge is not None else (0, 0, 0)
        speedups.set_bridge(consumers, enter, exit_, Routed, args_text)


class PyEventBuffer:
    """Pure-Python twin of ``polyprof._speedups.EventBuffer``. One flat list, seven items an event
    (type, start, end, id, parent, name, args), each event added by one ``extend``, so that another
    thread taking them (:meth:`take`) never splits an event. Flat rather than a tuple per event: no
    object per event for the garbage collector to count and scan, and 56 bytes an event, not 120.

    A span is written when it is entered, with ``None`` (:data:`OPEN`) as its end, and its exit
    writes the end in place: the placeholders are the thread's open spans, so there is no list of
    them to keep, and an exit is one store. A span still open when its list was taken (a flush) or
    cleared (a new recording) leaves that list alone and is written whole into the new one."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[Any] = []  # flat: FIELDS columns, then name and args, per event

    def add(self, type_: int, start: int, end: int, name: Any, ident: int, parent: int, args: Any) -> None:
        self.events.extend((type_, start, end, ident, parent, name, args))

    def clear(self) -> None:
        self.events = []

    def open_spans(self) -> list[tuple]:
        """(name, args, start, id, parent) of each span open in these events (entered, not exited)."""
        events = self.events
        return [(events[at + 5], events[at + 6], events[at + 1], events[at + 3], events[at + 4])
                for at in _open_at(events)]  # fmt: skip

    def take(self) -> PyEventBuffer:
        """A new buffer with every event; this one is left empty. The spans open now stay open in
        the new one (:meth:`open_spans`): their exits write into this buffer's next events."""
        out = PyEventBuffer()
        out.events, self.events = self.events, []
        return out

    def snapshot(self) -> tuple[Any, list, list]:
        import numpy as np

        events = self.events[:]
        for at in reversed(_open_at(events)):  # the open spans are not events yet
            del events[at : at + _STRIDE]
        rows = np.empty((len(events) // _STRIDE, FIELDS), dtype=np.int64)
        for field in range(FIELDS):
            rows[:, field] = events[field::_STRIDE]
        return rows, events[FIELDS::_STRIDE], events[FIELDS + 1 :: _STRIDE]

    def __len__(self) -> int:
        ends = self.events[2::_STRIDE]
        return len(ends) - ends.count(OPEN)


#: A span's end while it is open (PyEventBuffer).
OPEN = None


def _open_at(events: list) -> list[int]:
    """Where the open spans' events begin in a flat event list."""
    ends = events[2::_STRIDE]
    found, at = [], 0
    for _ in range(ends.count(OPEN)):
        at = ends.index(OPEN, at)
        found.append(at * _STRIDE)
        at += 1
    return found


def snapshot(buffer: Any) -> tuple[Any, list, list]:
    """``(rows [n x 5] int64: type, start, end, id, parent; names; args)`` of either buffer kind."""
    import numpy as np

    rows, names, args = buffer.snapshot()
    if isinstance(rows, bytes):
        rows = np.frombuffer(rows, dtype=np.int64).reshape(-1, FIELDS)
    return rows, names, args


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
        self._local = threading.local()
        self._buffers: list[ThreadBuffer] = []

    def buffer(self) -> Any:
        """The calling thread's event buffer (registered on first use)."""
        if speedups is not None:
            return speedups.thread_buffer()
        try:
            return self._local.events
        except AttributeError:
            events = PyEventBuffer()
            self._local.events = events
            self.register(events)
            return events

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
        _refresh_plain()
        if speedups is not None:
            speedups.set_active(True)

    def end(self) -> None:
        self.active = False
        _refresh_plain()
        if speedups is not None:
            speedups.set_active(False)

    def buffers(self) -> list[ThreadBuffer]:
        with self._lock:
            return list(self._buffers)

    def take(self) -> list[ThreadBuffer]:
        """Every thread's events so far, moved out of the threads' buffers (which are left empty and
        keep no memory), as ThreadBuffers of their own: what a recording hands over at its end."""
        with self._lock:
            return [b.taken() for b in self._buffers]


recorder = Recorder()

#: Recording, with no framework bridge and no correlation targets: all a span then does is record its
#: event (the pure-Python decorator's way, :func:`_span_call`, checks this one flag).
_plain = False


def _refresh_plain(_has_targets: bool = False) -> None:
    global _plain
    _plain = recorder.active and _bridge is None and not correlation.targets


correlation.targets_listeners.append(_refresh_plain)
_new_id = correlation.new_id
_current = correlation.current
_current_set, _current_reset = _current.set, _current.reset
# what the C spans make current too, where they are built
_current_id = correlation.current_external_id if speedups is not None else _current.get
_local = recorder._local


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

    if speedups is not None and cls is speedups.RecordFunction:  # each call a span, in C
        return functools.update_wrapper(speedups.SpanCall(fn, name, args), fn)
    if cls is _PyRecordFunction:  # (a subclass may override __enter__/__exit__: it goes the `with` way)
        return _span_call(fn, name, args)

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        with cls(name, args):
            return fn(*a, **kw)

    return wrapper


def _span_call(fn: Any, name: str, args: Any) -> Any:
    """``@record_function(name, args)`` on a plain function, on the pure-Python path: while all a span
    does is record its event (:data:`_plain`), each call opens and closes it inline, with no instance
    and no ``with`` (as ``speedups.SpanCall`` does in C); otherwise the call goes through
    :class:`_PyRecordFunction`. Both record the same event. The wrapper takes the function's own
    parameters where it can (:mod:`polyprof.forwarding`: ~700 instructions less a call than forwarding
    ``*a, **kw``), so a call that does not fit them raises before its span opens."""
    shape = signature_source(fn, defaults="span_defaults", kwdefaults="span_kwdefaults")
    if shape is not None and not shape.names & _span_call_names():
        make = _span_call_maker(shape.params, shape.call)
        span_call = make(fn, name, args, shape.defaults, shape.kwdefaults)
    else:  # not a plain function, *args or **kwargs, or a parameter named as a wrapper's own variable
        span_call = _span_call_maker("*a, **kw", "*a, **kw")(fn, name, args, (), {})
    return functools.update_wrapper(span_call, fn)


_SPAN_CALL_SOURCE = """\
def make_span_call(span_fn, span_name, span_args, span_defaults, span_kwdefaults):
    def span_call({params}):
        if not _plain:  # not recording, or the span is more than its event: the `with` way
            if recorder.active or _bridge is not None:
                with _PyRecordFunction(span_name, span_args):
                    return span_fn({call})
            return span_fn({call})
        span_id = _new_id()
        span_parent = _current_id()
        span_token = _current_set(span_id)
        try:
            span_buf = _local.events
        except AttributeError:
            span_buf = recorder.buffer()
        span_start = host_ns()
        span_events = span_buf.events
        span_events.extend((SPAN, span_start, OPEN, span_id, span_parent, span_name, span_args))
        span_end_at = len(span_events) - 5  # (only this thread appends to the list)
        try:
            return span_fn({call})
        finally:
            span_end = host_ns()
            _current_reset(span_token)
            if span_events is span_buf.events:
                span_events[span_end_at] = span_end
            else:  # the list was taken or cleared during the call: the whole span goes to the new one
                span_buf.events.extend((SPAN, span_start, span_end, span_id, span_parent, span_name, span_args))

    return span_call
"""


@functools.lru_cache(maxsize=256)
def _span_call_maker(params: str, call: str) -> Any:
    """``make_span_call(fn, name, args, defaults, kwdefaults)`` for one signature, compiled from
    :data:`_SPAN_CALL_SOURCE` in this module's globals (so it sees :data:`_plain` change); its source is
    put in :mod:`linecache`, so that a traceback through a decorated call shows its lines."""
    source = _SPAN_CALL_SOURCE.format(params=params, call=call)
    filename = f"<polyprof record_function wrapper ({params})>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    made: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), globals(), made)  # noqa: S102 - our own source, and the names of fn's parameters
    return made["make_span_call"]


def _names_in(code: types.CodeType) -> frozenset[str]:
    inner = (c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(code.co_names + code.co_varnames + code.co_freevars + code.co_cellvars).union(*map(_names_in, inner))


@functools.cache
def _span_call_names() -> frozenset[str]:
    """Every name the wrapper's code uses: a parameter of the decorated function must not be one."""
    return _names_in(_span_call_maker("", "").__code__)


class _PyRecordFunction:  # noqa: N801
    """A named span on the host timeline (`user_annotation`), usable as context manager or decorator.

    While it is open, device work launched from this thread/task gets its id as `External id`.
    `args` is a string (as in torch) or a dict of JSON-serialisable values.
    """

    __slots__ = ("name", "args", "_events", "_at", "_buf", "_token", "_range", "_handle")

    def __init__(self, name: str, args: str | dict[str, Any] | None = None) -> None:
        self.name = name
        self.args = args
        self._events = None  # while open in a recording: the list its event is in (_range and _handle
        # are set only where the bridge to a framework's ranges was installed)

    def __enter__(self) -> _PyRecordFunction:
        if _bridge is not None:
            self._enter_range()
        if recorder.active:
            i = _new_id()
            parent = _current_id()
            self._token = _current_set(i)
            if correlation.targets:
                correlation.push(i, correlation.KIND_ANNOTATION)
            try:  # the thread's buffer, without a call in the usual case
                buf = _local.events
            except AttributeError:
                buf = recorder.buffer()
            self._buf = buf
            start = host_ns()
            events = buf.events  # (read after the last call: a take() in between would miss the event)
            events.extend((SPAN, start, OPEN, i, parent, self.name, self.args))
            self._at = len(events) - _STRIDE  # only this thread appends to its list
            self._events = events
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        events = self._events
        if events is None:
            if _bridge is not None:
                self._exit_range()
            return
        end = host_ns()
        self._events = None
        _current_reset(self._token)
        self._token = None
        if correlation.targets:
            correlation.pop(correlation.KIND_ANNOTATION)
        at, buf = self._at, self._buf  # the entering thread's (a task may close it on another)
        self._buf = None
        if events is buf.events:  # (no call between the test and the store: no other thread runs)
            events[at + 2] = end
            if _bridge is not None and (args := self._exit_range()) is not self.args:
                events[at + 6] = args
        else:  # its list was taken or cleared meanwhile: the whole span goes to the new one
            args = self._exit_range() if _bridge is not None else self.args
            buf.events.extend((SPAN, events[at + 1], end, events[at + 3], events[at + 4], self.name, args))

    def _enter_range(self) -> None:
        # both set either way: an unset slot read with getattr's default raises inside (~0.3 us)
        self._range, self._handle = (
            _bridge.enter(str(self.name), args_text(self.args)) if _bridge.consumers() else (None, 0)
        )

    def _exit_range(self) -> Any:
        """Exit the framework range entered with the span, if any; the span's args to record."""
        try:
            rng, handle = self._range, self._handle
        except AttributeError:  # entered before the bridge was installed
            return self.args
        if rng is not None:
            self._range, self._handle = None, 0
            _bridge.exit(rng)
        return Routed(self.args, handle) if handle else self.args

    @property
    def open_state(self) -> tuple[int, int, int] | None:
        """(start, id, parent) while the span is open in a recording, else None."""
        events = self._events
        if events is None:
            return None
        at = self._at
        return events[at + 1], events[at + 3], events[at + 4]

    __call__ = _decorate


if speedups is not None:
    speedups.configure(
        correlation.current, recorder.register, correlation.push, correlation.pop, correlation.KIND_ANNOTATION,
        _decorate, _PyRecordFunction.__doc__,
    )  # fmt: skip
    record_function = speedups.RecordFunction  # noqa: N816 - the C type itself: no subclass to go through

else:
    record_function = _PyRecordFunction  # type: ignore[misc,assignment]


def _instant_py(name: str, args: dict[str, Any] | None = None) -> None:
    """A point in time on the calling thread's row (Chrome `i` event)."""
    if recorder.active:
        ts = host_ns()
        try:  # the thread's PyEventBuffer, add() inlined
            _local.events.events.extend((INSTANT, ts, ts, 0, _current_id(), name, args))
        except AttributeError:  # the thread's first event, or the C buffers
            recorder.buffer().add(INSTANT, ts, ts, name, 0, _current_id(), args)


def _counter_py(name: str, value: float) -> None:
    """A sample of a user counter (Chrome `C` event on the host process)."""
    if recorder.active:
        ts = host_ns()
        try:  # checked (and counted) at collect
            _local.events.events.extend((COUNTER, ts, ts, 0, 0, name, value))
        except AttributeError:
            recorder.buffer().add(COUNTER, ts, ts, name, 0, 0, value)


# one C call each where the extension is built (the twins above otherwise)
instant = speedups.instant if speedups is not None else _instant_py
counter = speedups.counter if speedups is not None else _counter_py
