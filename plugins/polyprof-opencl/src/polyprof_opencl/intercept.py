"""Wrapping pyopencl's enqueue functions while a profile records.

pyopencl's public functions (``enqueue_copy``, kernel calls, the generated kernel invokers,
``pyopencl.array``) reach the C extension through attributes of ``pyopencl._cl`` looked up at call
time: replacing those attributes for a recording catches every command, and outside one nothing is
wrapped. Not caught: a function taken from ``pyopencl._cl`` before the profile started and called
directly, and commands enqueued by C code.

A wrapper appends one record per call (:data:`FIELDS`): into the C extension's ``CallRecords`` (fixed
width, in chunks: no Python int or list append per call), else a row tuple to a list. The wrapper is
the C interceptor of ``_intercept.c`` (a few hundred ns per call, the caller's arguments forwarded
untouched) or, without a compiler, the same in Python. Kernels keep their kernel object and work sizes (a, b, c), other commands their byte count (a);
the command's event is kept as a raw retained handle, never the user's object (a NannyEvent keeps its
host array alive and blocks when dropped).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from polyprof.plugin import current_external_id, current_external_id_var, external_id_reader, host_ns
from polyprof_opencl.commands import COMMANDS, KERNEL, UNMAP_SPEC, CommandSpec, arg, hostbuf_bytes, nbytes_of

try:
    from polyprof_opencl import _intercept
except ImportError:  # not built (no compiler): the Python wrapper below records the same
    _intercept = None
else:
    _intercept.configure(current_external_id_var(), external_id_reader())

FIELDS = ("spec", "queue", "event", "start", "end", "tid", "external_id", "error", "a", "b", "c")
MODE_FALLBACK, MODE_ARGS_1_2_3, MODE_NBYTES_OF_ARG = 0, 1, 2  # how a, b, c are read (see _intercept.c)


class CallColumns:
    """Where wrappers record: ``holder[0]`` while recording (else None) is the C extension's
    ``CallRecords`` (a fixed-width record per call), or without it a list of row tuples."""

    def __init__(self) -> None:
        self.holder: list[Any] = [None]

    def begin(self) -> Any:
        self.holder[0] = records = _intercept.CallRecords() if _c_records() else []
        return records

    def end(self) -> None:
        self.holder[0] = None

    @staticmethod
    def rows(records: Any) -> list[tuple]:
        """Every call recorded, as a tuple of FIELDS, in call order."""
        return list(records) if type(records) is list else records.rows()


def _c_records() -> bool:
    return _intercept is not None and os.environ.get("POLYPROF_PURE_PYTHON", "") in ("", "0")


def interceptor(original: Callable, spec: Any, columns: CallColumns, *, mode: int, fallback: Callable,
                pos: int = 0, kw_name: str | None = None, handle_type: type | None = None,
                plain_event: Callable | None = None, retain_address: int = 0) -> Callable | None:
    """The C interceptor of `original` (None when it is not built or POLYPROF_PURE_PYTHON is set)."""
    if not _c_records():
        return None
    return _intercept.Interceptor(original, spec, columns.holder, mode, pos, kw_name, fallback, handle_type,
                                  plain_event or (lambda *a: None), retain_address)


recorder = CallColumns()
_current_external_id = current_external_id
_nanny: dict[str, Any] = {"type": None, "plain": lambda ptr, retain: None, "retain": 0}  # set at install


def _own_handle(event: Any) -> Any:
    """The event to keep: a NannyEvent becomes a plain retained handle to the same cl_event."""
    return _nanny["plain"](event.int_ptr, True) if type(event) is _nanny["type"] else event


def _payload(spec: CommandSpec) -> Callable[[tuple, dict], tuple]:
    """(a, b, c) of a call, where the C interceptor does not read them itself."""
    if spec.category == KERNEL:
        return lambda a, kw: (arg(a, kw, 1, "kernel"), arg(a, kw, 2, "global_work_size"), arg(a, kw, 3, "local_work_size"))
    return lambda args, kwargs: (nbytes_of(spec, args, kwargs), None, None)


@functools.cache  # made once a process, not ~20 interceptors and their closures at every profile's start
def _wrap(original: Callable, spec: CommandSpec, c_records: bool) -> Callable:
    """The wrapper of `original`: the C interceptor where `c_records` (so it keys the cache), else Python's."""
    mode, pos, kw_name = MODE_FALLBACK, 0, None
    if spec.category == KERNEL:
        mode = MODE_ARGS_1_2_3
    elif spec.nbytes is hostbuf_bytes:
        mode, pos, kw_name = MODE_NBYTES_OF_ARG, 2, "hostbuf"
    fast = interceptor(original, spec, recorder, mode=mode, pos=pos, kw_name=kw_name, fallback=_payload(spec),
                       handle_type=_nanny["type"], plain_event=_nanny["plain"], retain_address=_nanny["retain"]) if c_records else None
    return fast if fast is not None else _python_wrapper(original, spec, _payload(spec))


def _python_wrapper(original: Callable, spec: CommandSpec, payload: Callable, queue_at: int = 0) -> Callable:
    """The same record in Python. `queue_at`: the queue's position among the arguments (1 for a method)."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        columns = recorder.holder[0]
        if columns is None:
            return original(*args, **kwargs)
        start, error, result = host_ns(), "", None
        try:
            result = original(*args, **kwargs)
            return result
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            event = _own_handle(result[1] if type(result) is tuple else result)
            row = (spec, arg(args, kwargs, queue_at, "queue"), event, start, host_ns(), threading.get_native_id(),
                   _current_external_id(), error, *payload(args, kwargs))
            columns.append(row)

    wrapper.__polyprof_original__ = original  # type: ignore[attr-defined]
    return wrapper


@functools.cache  # a CDLL is a dlopen and a new ctypes type: once a process
def cl_retain_event_address() -> int:
    """Address of clRetainEvent in the OpenCL loader already loaded in this process (pyopencl's), or 0."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libOpenCL" in line and line.split()[-1].startswith("/")}
    except OSError:
        return 0
    for path in sorted(paths):
        try:
            return int(ctypes.cast(ctypes.CDLL(path).clRetainEvent, ctypes.c_void_p).value or 0)
        except (OSError, AttributeError):
            continue
    return 0


def adopt_event(event: Any) -> Any:
    """A recorded event: raw retained handles (ints) become pyopencl Events owning that reference."""
    if isinstance(event, int):
        import pyopencl

        return pyopencl.Event.from_int_ptr(event, retain=False)
    return event


class Patches:
    """Install and remove the wrappers (and the profiling-enabled queue class) in pyopencl."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._lock = threading.Lock()

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self, cl: Any) -> None:
        with self._lock:
            if self._saved:
                return
            _cl = cl._cl
            _nanny.update(type=getattr(_cl, "NannyEvent", None), plain=_cl.Event.from_int_ptr,
                          retain=cl_retain_event_address())
            for spec in COMMANDS:
                original = getattr(_cl, spec.attr, None)
                if original is not None:
                    self._set(_cl, spec.attr, wrapper := _wrap(original, spec, _c_records()))
                    if getattr(cl, spec.attr, None) is original:  # re-exported under the same name
                        self._set(cl, spec.attr, wrapper)
            memory_map = getattr(_cl, "MemoryMap", None)
            if memory_map is not None and hasattr(memory_map, "release"):
                release = _python_wrapper(memory_map.release, UNMAP_SPEC, _payload(UNMAP_SPEC), queue_at=1)
                self._set(memory_map, "release", release)
            if cl.CommandQueue is not (queue_class := profiling_queue_class(cl)):
                self._set(cl, "CommandQueue", queue_class)

    def _set(self, owner: Any, attr: str, value: Any) -> None:
        self._saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def remove(self) -> None:
        with self._lock:
            for owner, attr, original in reversed(self._saved):
                setattr(owner, attr, original)
            self._saved.clear()


patches = Patches()
_queue_classes: dict[int, Any] = {}
#: who asked for profiling-enabled queues: the user (enable_queue_profiling) and running profiles
_queue_profiling: dict[str, Any] = {"user": False, "profiles": 0, "saved": None}


def profiling_queue_class(cl: Any) -> Any:
    """A CommandQueue subclass that adds PROFILING_ENABLE to whatever properties are asked for."""
    base = cl._cl.CommandQueue
    if id(base) not in _queue_classes:
        flag = cl.command_queue_properties.PROFILING_ENABLE

        class CommandQueue(base):  # type: ignore[misc,valid-type]
            __doc__ = base.__doc__

            def __init__(self, context: Any, device: Any = None, properties: Any = None) -> None:
                super().__init__(context, device, (properties or 0) | flag)

        CommandQueue.__module__, CommandQueue.__qualname__ = "pyopencl", "CommandQueue"
        _queue_classes[id(base)] = CommandQueue
    return _queue_classes[id(base)]


def _change_queue_profiling(cl: Any, user: bool | None = None, profiles: int = 0) -> None:
    """Update who asks for profiling-enabled queues; swap pyopencl's class when that turns on or off."""
    state = _queue_profiling
    was = state["user"] or state["profiles"] > 0
    state["user"] = state["user"] if user is None else user
    state["profiles"] = max(0, state["profiles"] + profiles)
    on = state["user"] or state["profiles"] > 0
    if on and not was:
        _queue_profiling["saved"] = cl.CommandQueue
        cl.CommandQueue = profiling_queue_class(cl)
    elif was and not on and _queue_profiling["saved"] is not None:
        if cl.CommandQueue is profiling_queue_class(cl):
            cl.CommandQueue = _queue_profiling["saved"]
        _queue_profiling["saved"] = None


def hold_queue_profiling(cl: Any, hold: bool = True) -> None:
    """While a profile runs (all of it: wait, warm-up and active steps), new queues are
    profiling-enabled, so that queues created at any step of a scheduled profile are timed.
    ``hold=False`` undoes one hold."""
    _change_queue_profiling(cl, profiles=1 if hold else -1)


def enable_queue_profiling() -> None:
    """From now on, every ``pyopencl.CommandQueue(...)`` is profiling-enabled, profile or not. Call it
    before creating queues a later profile should time (a queue's properties cannot change after)."""
    import pyopencl as cl

    _change_queue_profiling(cl, user=True)


def disable_queue_profiling() -> None:
    """Undo :func:`enable_queue_profiling`."""
    import pyopencl as cl

    _change_queue_profiling(cl, user=False)
