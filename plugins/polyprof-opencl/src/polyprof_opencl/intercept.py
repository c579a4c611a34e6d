"""Wrapping pyopencl's enqueue functions while a profile records.

pyopencl's public functions (``enqueue_copy``, ``enqueue_fill_buffer``, kernel calls, the generated
kernel invokers, ``pyopencl.array``) all reach the C extension through attributes of
``pyopencl._cl`` looked up at call time. Replacing those attributes for the duration of a recording
catches every command. Outside a recording nothing is wrapped, so a program pays nothing.

Not caught: a function object taken from ``pyopencl._cl`` before the profile started and called
directly (``from pyopencl._cl import enqueue_nd_range_kernel``), and commands enqueued by C code.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyprof.plugin import current_external_id_var, host_ns
from polyprof_opencl.calls import MODE_ARGS_1_2_3, MODE_FALLBACK, MODE_NBYTES_OF_ARG, CallColumns, interceptor

KERNEL, MEMCPY, MEMSET, MAP, UNMAP = "kernel", "memcpy", "memset", "map", "unmap"


@dataclass(frozen=True)
class CommandSpec:
    """One intercepted entry point of pyopencl._cl."""

    attr: str
    category: str
    api: str  # the OpenCL call it makes, the name of the host-side runtime row
    direction: str = ""  # HtoD, DtoH, DtoD for copies
    nbytes: Callable[[tuple, dict], int | None] | None = None


def _arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else default


def _host_bytes(obj: Any) -> int | None:
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        return memoryview(obj).nbytes
    except TypeError:
        return None


def _hostbuf_bytes(args: tuple, kwargs: dict) -> int | None:
    hostbuf = args[2] if len(args) > 2 else kwargs.get("hostbuf")
    nbytes = getattr(hostbuf, "nbytes", None)  # numpy arrays: the common case, answered without a call
    return nbytes if type(nbytes) is int else _host_bytes(hostbuf)


def _copy_buffer_bytes(args: tuple, kwargs: dict) -> int | None:
    count = _arg(args, kwargs, 3, "byte_count", -1)
    if isinstance(count, int) and count >= 0:
        return count
    src, dst = _arg(args, kwargs, 1, "src"), _arg(args, kwargs, 2, "dst")
    try:
        return min(
            int(src.size) - int(_arg(args, kwargs, 4, "src_offset", 0)),
            int(dst.size) - int(_arg(args, kwargs, 5, "dst_offset", 0)),
        )
    except Exception:
        return None


def _rect_bytes(region_pos: int) -> Callable[[tuple, dict], int | None]:
    def nbytes(args: tuple, kwargs: dict) -> int | None:
        region = _arg(args, kwargs, region_pos, "region")
        try:
            total = 1
            for r in region:
                total *= int(r)
            return total
        except Exception:
            return None

    return nbytes


def _fill_bytes(args: tuple, kwargs: dict) -> int | None:
    size = _arg(args, kwargs, 4, "size")
    return size if isinstance(size, int) else None


def _map_bytes(args: tuple, kwargs: dict) -> int | None:
    shape, dtype = _arg(args, kwargs, 4, "shape"), _arg(args, kwargs, 5, "dtype")
    try:
        import numpy as np

        return int(np.prod(shape)) * np.dtype(dtype).itemsize
    except Exception:
        return None


def _svm_memcpy_bytes(args: tuple, kwargs: dict) -> int | None:
    return _host_bytes(_arg(args, kwargs, 3, "src"))


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("enqueue_nd_range_kernel", KERNEL, "clEnqueueNDRangeKernel"),
    CommandSpec("_enqueue_read_buffer", MEMCPY, "clEnqueueReadBuffer", "DtoH", _hostbuf_bytes),
    CommandSpec("_enqueue_write_buffer", MEMCPY, "clEnqueueWriteBuffer", "HtoD", _hostbuf_bytes),
    CommandSpec("_enqueue_copy_buffer", MEMCPY, "clEnqueueCopyBuffer", "DtoD", _copy_buffer_bytes),
    CommandSpec("_enqueue_read_buffer_rect", MEMCPY, "clEnqueueReadBufferRect", "DtoH", _rect_bytes(5)),
    CommandSpec("_enqueue_write_buffer_rect", MEMCPY, "clEnqueueWriteBufferRect", "HtoD", _rect_bytes(5)),
    CommandSpec("_enqueue_copy_buffer_rect", MEMCPY, "clEnqueueCopyBufferRect", "DtoD", _rect_bytes(5)),
    CommandSpec("_enqueue_read_image", MEMCPY, "clEnqueueReadImage", "DtoH"),
    CommandSpec("_enqueue_write_image", MEMCPY, "clEnqueueWriteImage", "HtoD"),
    CommandSpec("_enqueue_copy_image", MEMCPY, "clEnqueueCopyImage", "DtoD"),
    CommandSpec("_enqueue_copy_image_to_buffer", MEMCPY, "clEnqueueCopyImageToBuffer", "DtoD"),
    CommandSpec("_enqueue_copy_buffer_to_image", MEMCPY, "clEnqueueCopyBufferToImage", "DtoD"),
    CommandSpec("_enqueue_svm_memcpy", MEMCPY, "clEnqueueSVMMemcpy", "SVM", _svm_memcpy_bytes),
    CommandSpec("_enqueue_fill_buffer", MEMSET, "clEnqueueFillBuffer", "", _fill_bytes),
    CommandSpec("enqueue_fill_image", MEMSET, "clEnqueueFillImage"),
    CommandSpec("_enqueue_svm_memfill", MEMSET, "clEnqueueSVMMemFill"),
    CommandSpec("enqueue_map_buffer", MAP, "clEnqueueMapBuffer", "map", _map_bytes),
    CommandSpec("enqueue_map_image", MAP, "clEnqueueMapImage", "map"),
    CommandSpec("_enqueue_svm_map", MAP, "clEnqueueSVMMap", "map"),
    CommandSpec("_enqueue_svm_unmap", UNMAP, "clEnqueueSVMUnmap", "unmap"),
)
UNMAP_SPEC = CommandSpec("MemoryMap.release", UNMAP, "clEnqueueUnmapMemObject", "unmap")


@dataclass
class Record:
    """One intercepted enqueue, decoded at collect time from the raw tuple the wrapper stored."""

    spec: CommandSpec
    queue: Any
    event: Any
    start: int
    end: int
    tid: int
    external_id: int
    kernel: Any = None
    global_size: Any = None
    local_size: Any = None
    nbytes: int | None = None
    error: str = ""

    @classmethod
    def decode(cls, raw: tuple) -> Record:
        spec, queue, event, start, end, tid, ext, error, a, b, c = raw
        rec = cls(spec, queue, event, start, end, tid, ext, error=error)
        if spec.category == KERNEL:
            rec.kernel, rec.global_size, rec.local_size = a, b, c
        else:
            rec.nbytes = a
        return rec


class Recorder(CallColumns):
    """Where wrappers record calls: the recording session's columns, or nothing when not recording.

    Records are stored column-wise (one list per field, see ``polyprof_opencl.calls.FIELDS``) so that
    recording keeps no new container alive per call (the only one is the command's Event, which
    collect needs): every object the profiler keeps makes the garbage collector's passes longer.
    Kernels keep their kernel object and work sizes (a, b, c); other commands their byte count (a), so
    no host array or buffer is kept alive.
    """


recorder = Recorder()
_current_external_id = current_external_id_var().get

_nanny_event_type: type | None = None  # set when patches install
_retain_address = 0  # clRetainEvent of the OpenCL loader pyopencl uses, when it can be found
_plain_event: Callable[..., Any] = lambda ptr, retain: None  # noqa: E731 - set when patches install


def _own_handle(event: Any) -> Any:
    """The event to keep for timing. A NannyEvent (host-buffer transfers) waits for its command and
    keeps the host array alive until it is dropped: keeping the user's object would change when the
    program blocks and how long its arrays live. Keep a plain retained handle to the same cl_event
    instead, and let the user's object die when it would have."""
    if type(event) is _nanny_event_type:
        return _plain_event(event.int_ptr, True)
    return event


def _nbytes(spec: CommandSpec, args: tuple, kwargs: dict) -> int | None:
    if spec.nbytes is None:
        return None
    try:
        return spec.nbytes(args, kwargs)
    except Exception:
        return None


def _payload(spec: CommandSpec) -> Callable[[tuple, dict], tuple]:
    """(a, b, c) of a call, for the cases the C interceptor does not read itself."""
    if spec.category == KERNEL:
        return lambda args, kwargs: (
            _arg(args, kwargs, 1, "kernel"),
            _arg(args, kwargs, 2, "global_work_size"),
            _arg(args, kwargs, 3, "local_work_size"),
        )
    return lambda args, kwargs: (_nbytes(spec, args, kwargs), None, None)


def _wrap(original: Callable, spec: CommandSpec) -> Callable:
    if spec.category == KERNEL:
        mode, pos, kw_name = MODE_ARGS_1_2_3, 0, None
    elif spec.nbytes is _hostbuf_bytes:
        mode, pos, kw_name = MODE_NBYTES_OF_ARG, 2, "hostbuf"
    else:
        mode, pos, kw_name = MODE_FALLBACK, 0, None
    fast = interceptor(
        original,
        spec,
        recorder,
        mode=mode,
        pos=pos,
        kw_name=kw_name,
        fallback=_payload(spec),
        handle_type=_nanny_event_type,
        plain_event=_plain_event,
        retain_address=_retain_address,
    )
    return fast if fast is not None else _python_wrapper(original, spec)


def _python_wrapper(original: Callable, spec: CommandSpec) -> Callable:
    """The same recording in Python, when polyprof's C extension is not built."""
    kernel = spec.category == KERNEL
    get_tid = threading.get_native_id
    payload = _payload(spec)
    holder = recorder.holder

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        columns = holder[0]
        if columns is None:
            return original(*args, **kwargs)
        start = host_ns()
        error = ""
        result = None
        try:
            result = original(*args, **kwargs)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            end = host_ns()
            c_spec, c_queue, c_event, c_start, c_end, c_tid, c_ext, c_error, c_a, c_b, c_c = columns
            c_spec.append(spec)
            c_queue.append(args[0] if args else kwargs.get("queue"))
            c_event.append(_own_handle(result[1] if type(result) is tuple else result))
            c_start.append(start)
            c_end.append(end)
            c_tid.append(get_tid())
            c_ext.append(_current_external_id())
            c_error.append(error)
            a, b, c = args[1:4] if kernel and not kwargs and len(args) >= 4 else payload(args, kwargs)
            c_a.append(a)
            c_b.append(b)
            c_c.append(c)
        return result

    wrapper.__polyprof_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _wrap_unmap(original: Callable) -> Callable:
    @functools.wraps(original)
    def release(self: Any, queue: Any = None, wait_for: Any = None) -> Any:
        columns = recorder.holder[0]
        if columns is None:
            return original(self, queue, wait_for)
        start = host_ns()
        result = original(self, queue, wait_for)
        row = (
            UNMAP_SPEC,
            queue,
            result,
            start,
            host_ns(),
            threading.get_native_id(),
            _current_external_id(),
            "",
            None,
            None,
            None,
        )
        for column, value in zip(columns, row, strict=True):
            column.append(value)
        return result

    release.__polyprof_original__ = original  # type: ignore[attr-defined]
    return release


def cl_retain_event_address() -> int:
    """Address of clRetainEvent in the OpenCL loader already loaded in this process (pyopencl's), or 0."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {
                line.split()[-1] for line in f if "libOpenCL" in line and line.split()[-1].startswith("/")
            }
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
        global _nanny_event_type, _plain_event, _retain_address
        with self._lock:
            if self._saved:
                return
            _cl = cl._cl
            _nanny_event_type = getattr(_cl, "NannyEvent", None)
            _retain_address = cl_retain_event_address()
            _plain_event = _cl.Event.from_int_ptr
            for spec in COMMANDS:
                original = getattr(_cl, spec.attr, None)
                if original is None:
                    continue
                wrapper = _wrap(original, spec)
                self._set(_cl, spec.attr, wrapper)
                if getattr(cl, spec.attr, None) is original:  # re-exported under the same name
                    self._set(cl, spec.attr, wrapper)
            memory_map = getattr(_cl, "MemoryMap", None)
            if memory_map is not None and hasattr(memory_map, "release"):
                self._set(memory_map, "release", _wrap_unmap(memory_map.release))
            queue_class = profiling_queue_class(cl)
            if cl.CommandQueue is not queue_class:
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
_always_enabled = {"on": False, "saved": None}


def profiling_queue_class(cl: Any) -> Any:
    """A CommandQueue subclass that adds PROFILING_ENABLE to whatever properties are asked for."""
    base = cl._cl.CommandQueue
    cls = _queue_classes.get(id(base))
    if cls is None:
        flag = cl.command_queue_properties.PROFILING_ENABLE

        class CommandQueue(base):  # type: ignore[misc,valid-type]
            __doc__ = base.__doc__

            def __init__(self, context: Any, device: Any = None, properties: Any = None) -> None:
                super().__init__(context, device, (properties or 0) | flag)

        CommandQueue.__module__ = "pyopencl"
        CommandQueue.__qualname__ = "CommandQueue"
        cls = _queue_classes[id(base)] = CommandQueue
    return cls


_profiles_holding = {"count": 0, "saved": None}


def hold_queue_profiling(cl: Any) -> None:
    """While a profile runs (all of it: wait, warm-up and active steps), make new queues
    profiling-enabled, so that queues created at any step of a scheduled profile are timed."""
    if _profiles_holding["count"] == 0 and not _always_enabled["on"]:
        _profiles_holding["saved"] = cl.CommandQueue
        cl.CommandQueue = profiling_queue_class(cl)
    _profiles_holding["count"] += 1


def release_queue_profiling(cl: Any) -> None:
    """Undo one :func:`hold_queue_profiling` (the last one restores pyopencl's class)."""
    if _profiles_holding["count"] == 0:
        return
    _profiles_holding["count"] -= 1
    if _profiles_holding["count"] == 0 and _profiles_holding["saved"] is not None:
        if cl.CommandQueue is profiling_queue_class(cl):
            cl.CommandQueue = _profiles_holding["saved"]
        _profiles_holding["saved"] = None


def enable_queue_profiling() -> None:
    """From now on, every ``pyopencl.CommandQueue(...)`` is profiling-enabled, profile or not.

    Call it before creating queues that a later profile should time (a queue's properties cannot be
    changed after creation). Costs the runtime's per-command timestamping, nothing else.
    """
    import pyopencl as cl

    if not _always_enabled["on"]:
        _always_enabled["saved"] = cl.CommandQueue
        cl.CommandQueue = profiling_queue_class(cl)
        _always_enabled["on"] = True


def disable_queue_profiling() -> None:
    """Undo :func:`enable_queue_profiling`."""
    import pyopencl as cl

    if _always_enabled["on"]:
        cl.CommandQueue = _always_enabled["saved"]
        _always_enabled["on"] = False
