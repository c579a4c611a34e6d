"""The recorder in Python: the twin of _native/csrc/recorder.c, for interpreters without polyprof's extension.

The same names and the same events as the C recorder: ``RecordFunction`` (``polyprof.record_function``),
``SpanCall`` (what ``@record_function`` makes of a plain function), the per-thread ``EventBuffer``,
``instant``, ``counter`` and the process's ids. :mod:`polyprof.annotations` configures either one
alike (:func:`configure`, :func:`set_active`, :func:`set_bridge`, :func:`set_has_targets`)::

    configure(contextvar, register, push, pop, "annotation", decorate, doc)
    set_active(True)
    with RecordFunction("load batch"):
        ...

One difference: a decorated function called with arguments that do not fit its parameters raises
its TypeError before its span opens here, inside the span in C.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import threading
import types
from contextvars import ContextVar
from typing import Any

from polyprof._native.shared import COUNTER, FIELDS, INSTANT, SPAN, host_ns, np

#: a span's end while it is open (EventBuffer)
OPEN = None
STRIDE = FIELDS + 2  # and name, args: one event in an EventBuffer

#: a new process-wide id (annotations, ops and backends share them, so ids never collide)
next_id = itertools.count(1).__next__


def new_ids(n: int) -> np.ndarray:
    """`n` new process-wide ids (int64)."""
    return np.fromiter((next_id() for _ in range(n)), dtype=np.int64, count=n)


# -- what annotations.py configures ------------------------------------------------------------------
_contextvar: ContextVar[int] = ContextVar("polyprof_external_id (unconfigured)", default=0)
_current_id = _contextvar.get
_current_set, _current_reset = _contextvar.set, _contextvar.reset
_register: Any = None
_push: Any = None
_pop: Any = None
_kind_annotation: Any = None
_decorate: Any = None
_active = False
_has_targets = False
_bridge: Any = None
_routed: Any = None
_args_text: Any = None
_local = threading.local()
#: recording, with no framework bridge and no correlation targets: all a span then does is record its
#: event (the decorator's inline way, :func:`SpanCall`, checks this one flag)
_plain = False


def configure(contextvar: ContextVar[int], register: Any, push: Any, pop: Any, annotation_kind: Any,
              decorate: Any, doc: str) -> None:
    """What the recorder shares with Python: the current external id's variable, the callable told of
    each thread's new buffer, the correlation fan-out (push/pop), the decorator and the docstring."""
    global \
        _contextvar, \
        _current_id, \
        _current_set, \
        _current_reset, \
        _register, \
        _push, \
        _pop, \
        _kind_annotation, \
        _decorate
    _contextvar, _register, _push, _pop, _kind_annotation, _decorate = (
        contextvar,
        register,
        push,
        pop,
        annotation_kind,
        decorate,
    )
    _current_id, _current_set, _current_reset = contextvar.get, contextvar.set, contextvar.reset
    RecordFunction.__doc__ = doc


def _refresh_plain() -> None:
    global _plain
    _plain = _active and _bridge is None and not _has_targets


def set_active(active: bool) -> None:
    global _active
    _active = bool(active)
    _refresh_plain()


def set_has_targets(has: bool) -> None:
    global _has_targets
    _has_targets = bool(has)
    _refresh_plain()


def set_bridge(bridge: Any, routed: Any, args_text: Any) -> None:
    """The bridge to a framework's own ranges (an ``annotations.FrameworkBridge``; None removes it)."""
    global _bridge, _routed, _args_text
    _bridge, _routed, _args_text = bridge, routed, args_text
    _refresh_plain()


def current_external_id() -> int:
    return _current_id()


def external_id_reader() -> int:
    """0: there is no C reader here (a C interceptor reads the context variable instead)."""
    return 0


def thread_context_fast() -> bool:
    return False


class EventBuffer:
    """One thread's events. One flat list, seven items an event (type, start, end, id, parent, name,
    args), each event added by one ``extend``, so that another thread taking them (:meth:`take`) never
    splits an event. Flat rather than a tuple per event: no object per event for the garbage collector
    to count and scan, and 56 bytes an event, not 120.

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
                for at in _open_at(events)]

    def take(self) -> EventBuffer:
        """A new buffer with every event; this one is left empty. The spans open now stay open in
        the new one (:meth:`open_spans`): their exits write into this buffer's next events."""
        out = EventBuffer()
        out.events, self.events = self.events, []
        return out

    def snapshot(self) -> tuple[np.ndarray, list, list]:
        events = self.events[:]
        for at in reversed(_open_at(events)):  # the open spans are not events yet
            del events[at : at + STRIDE]
        rows = np.empty((len(events) // STRIDE, FIELDS), dtype=np.int64)
        for field in range(FIELDS):
            rows[:, field] = events[field::STRIDE]
        return rows, events[FIELDS::STRIDE], events[FIELDS + 1 :: STRIDE]

    def __len__(self) -> int:
        ends = self.events[2::STRIDE]
        return len(ends) - ends.count(OPEN)


def _open_at(events: list) -> list[int]:
    """Where the open spans' events begin in a flat event list."""
    ends = events[2::STRIDE]
    found, at = [], 0
    for _ in range(ends.count(OPEN)):
        at = ends.index(OPEN, at)
        found.append(at * STRIDE)
        at += 1
    return found


def thread_buffer() -> EventBuffer:
    """The calling thread's buffer (made, and told to the configured `register`, on first use)."""
    try:
        return _local.events
    except AttributeError:
        events = EventBuffer()
        _local.events = events
        if _register is not None:
            _register(events)
        return events


class RecordFunction:
    # the docstring is annotations' (set by configure): one text for both recorders
    __slots__ = ("name", "args", "_events", "_at", "_buf", "_token", "_range", "_handle")

    def __init__(self, name: str, args: str | dict[str, Any] | None = None) -> None:
        self.name = name
        self.args = args
        self._events = None  # while open in a recording: the list its event is in (_range and _handle
        # are set only where the bridge to a framework's ranges was installed)

    def __enter__(self) -> RecordFunction:
        if _bridge is not None:
            self._enter_range()
        if _active:
            i = next_id()
            parent = _current_id()
            self._token = _current_set(i)
            if _has_targets:
                _push(i, _kind_annotation)
            try:  # the thread's buffer, without a call in the usual case
                buf = _local.events
            except AttributeError:
                buf = thread_buffer()
            self._buf = buf
            start = host_ns()
            events = buf.events  # (read after the last call: a take() in between would miss the event)
            events.extend((SPAN, start, OPEN, i, parent, self.name, self.args))
            self._at = len(events) - STRIDE  # only this thread appends to its list
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
        if _has_targets:
            _pop(_kind_annotation)
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
            _bridge.enter(str(self.name), _args_text(self.args)) if _bridge.consumers() else (None, 0)
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
        return _routed(self.args, handle) if handle else self.args

    @property
    def open_state(self) -> tuple[int, int, int] | None:
        """(start, id, parent) while the span is open in a recording, else None."""
        events = self._events
        if events is None:
            return None
        at = self._at
        return events[at + 1], events[at + 3], events[at + 4]

    def __call__(self, fn: Any) -> Any:
        return _decorate(self, fn)


def SpanCall(fn: Any, name: str, args: Any = None) -> Any:  # noqa: N802 - the C type's name
    """``@record_function(name, args)`` on a plain function: while all a span does is record its event
    (:data:`_plain`), each call opens and closes it inline, with no instance and no ``with`` (as the C
    SpanCall does); otherwise the call goes through :class:`RecordFunction`. Both record the same event.
    The wrapper takes the function's own parameters where it can (:mod:`polyprof._native.twins.forwarding`: ~700
    instructions less a call than forwarding ``*a, **kw``), so a call that does not fit them raises
    before its span opens."""
    from polyprof._native.twins.forwarding import signature_source

    shape = signature_source(fn, defaults="span_defaults", kwdefaults="span_kwdefaults")
    if shape is not None and not shape.names & _span_call_names():
        make = _span_call_maker(shape.params, shape.call)
        return make(fn, name, args, shape.defaults, shape.kwdefaults)
    # not a plain function, *args or **kwargs, or a parameter named as a wrapper's own variable
    return _span_call_maker("*a, **kw", "*a, **kw")(fn, name, args, (), {})


_SPAN_CALL_SOURCE = """\
def make_span_call(span_fn, span_name, span_args, span_defaults, span_kwdefaults):
    def span_call({params}):
        if not _plain:  # not recording, or the span is more than its event: the `with` way
            if _active or _bridge is not None:
                with RecordFunction(span_name, span_args):
                    return span_fn({call})
            return span_fn({call})
        span_id = next_id()
        span_parent = _current_id()
        span_token = _current_set(span_id)
        try:
            span_buf = _local.events
        except AttributeError:
            span_buf = thread_buffer()
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
    return frozenset(code.co_names + code.co_varnames + code.co_freevars + code.co_cellvars).union(
        *map(_names_in, inner)
    )


@functools.cache
def _span_call_names() -> frozenset[str]:
    """Every name the wrapper's code uses: a parameter of the decorated function must not be one."""
    return _names_in(_span_call_maker("", "").__code__)


def instant(name: str, args: dict[str, Any] | None = None) -> None:
    """A point in time on the calling thread's row (Chrome `i` event)."""
    if _active:
        ts = host_ns()
        try:  # the thread's buffer, add() inlined
            _local.events.events.extend((INSTANT, ts, ts, 0, _current_id(), name, args))
        except AttributeError:  # the thread's first event
            thread_buffer().add(INSTANT, ts, ts, name, 0, _current_id(), args)


def counter(name: str, value: float) -> None:
    """A sample of a user counter (Chrome `C` event on the host process)."""
    if _active:
        ts = host_ns()
        try:  # checked (and counted) at collect
            _local.events.events.extend((COUNTER, ts, ts, 0, 0, name, value))
        except AttributeError:
            thread_buffer().add(COUNTER, ts, ts, name, 0, 0, value)
