"""The two libcupti entry points polyprof calls directly (ctypes), beside cupti-python: the activity
buffer callbacks and the record walk, so that CUPTI's buffers stay raw memory until collect (see
:mod:`polyprof_cuda.raw_buffers` for why).

The library is the very libcupti cupti-python loaded (found in /proc/self/maps), never a second copy:

    lib = LibCupti.loaded()
    lib.register_buffer_callbacks(pool.requested, pool.completed)
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

_REQUEST = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)
CUPTI_SUCCESS = 0

# CUPTI keeps the callback pointers for the life of the process: the ctypes thunks live here, made once,
# and call whichever Python callables were registered last.
_targets: dict[str, Callable | None] = {"requested": None, "completed": None}


def _on_requested(buffer, size, max_records) -> None:
    target = _targets["requested"]
    if target is None:  # nothing is tracing: CUPTI gets no buffer and records nothing
        buffer[0], size[0], max_records[0] = None, 0, 0
        return
    try:
        addr, nbytes = target()
    except Exception:  # never raise into CUPTI: without a buffer it drops records and counts them
        addr, nbytes = None, 0
    buffer[0], size[0], max_records[0] = addr, nbytes, 0


def _on_completed(_context, _stream_id, buffer, _size, valid) -> None:
    target = _targets["completed"]
    if target is not None and buffer:
        try:
            target(int(buffer), int(valid))
        except Exception:
            pass  # the pool counts what it could not keep; nothing may propagate into CUPTI


_THUNKS = (_REQUEST(_on_requested), _COMPLETE(_on_completed))


def loaded_path() -> str | None:
    """The path of the libcupti this process has loaded, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "/libcupti.so" in path:
                    return path
    except OSError:
        pass
    return None


class LibCupti:
    """ctypes bindings of ``cuptiActivityRegisterCallbacks`` and ``cuptiActivityGetNextRecord``."""

    def __init__(self, path: str) -> None:
        self.path = path
        lib = ctypes.CDLL(path)
        self._register = lib.cuptiActivityRegisterCallbacks
        self._register.argtypes = [_REQUEST, _COMPLETE]
        self._register.restype = ctypes.c_int
        self._next = lib.cuptiActivityGetNextRecord
        self._next.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self._next.restype = ctypes.c_int

    @classmethod
    def loaded(cls) -> LibCupti:
        """The libcupti cupti-python loaded (call after cupti-python has talked to CUPTI once)."""
        path = loaded_path()
        if path is None:
            raise OSError("libcupti is not loaded in this process (cupti-python has not called CUPTI yet)")
        return cls(path)

    def register_buffer_callbacks(
        self, requested: Callable[[], tuple[int, int]], completed: Callable[[int, int], None]
    ) -> None:
        """Route CUPTI's buffer requests and completions to `requested`/`completed`."""
        _targets["requested"], _targets["completed"] = requested, completed
        status = self._register(*_THUNKS)
        if status != CUPTI_SUCCESS:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks failed with CUPTI error {status}")

    def unregister(self) -> None:
        """Stop handing CUPTI buffers (it then records nothing until the next register)."""
        _targets["requested"] = _targets["completed"] = None

    def next_record(self, buffer: int, valid: int, record: int) -> int | None:
        """The address of the record after `record` in `buffer`, or None after the last one."""
        current = ctypes.c_void_p(record)
        status = self._next(buffer, valid, ctypes.byref(current))
        if status != CUPTI_SUCCESS:
            return None
        return current.value
