"""polyprof's own PyTorch operator observer: RecordFunction callbacks in C++ writing per-thread columnar
buffers, read out in bulk after stop. It replaces torch's collector (``_enable_profiler`` /
``_disable_profiler``) for every option (``with_stack``'s Python calls are the python backend's), because stopping that collector alone takes
longer than polyprof's whole stop-to-trace budget.

::

    from polyprof.torch import observer
    obs = observer.get(torch)                 # builds once per torch (see builder.py), then loads
    obs.start(observer.RECORD_SHAPES)         # options: a sum of the flags below
    ...                                       # run operators on this thread
    n = obs.stop()                            # same thread as start
    columns, names = obs.columns(n)
    obs.reset()

While it records, ``n = obs.take()`` hands over what the threads have completed (read it the same way,
then ``obs.release()``); ops still open stay with their threads until a later take or stop.

While it records, torch-side code sees a profiler (``torch._C._autograd._profiler_type()`` is KINETO),
so ``_RecordFunctionFast`` and kwargs-carrying ranges are recorded and the allocator reports memory
(``PROFILE_MEMORY``). ``POLYPROF_TORCH_OBSERVER=0`` turns it off (the torch backend then uses torch's
collector).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from polyprof.torch.observer.builder import (
    BuildError,
    build,
    cached_library,
    library_path,
    open_trusted,
)

__all__ = ["BuildError", "Observer", "cached", "disabled", "get", "library_path"]

ABI_VERSION = 11
# options of start() (the k* flags of observer.cpp)
RECORD_SHAPES, PROFILE_MEMORY, WITH_FLOPS, WITH_MODULES, ALL_THREADS, OVERLOAD_NAMES = 1, 2, 4, 8, 16, 32
TOP_LEVEL_ONLY = 64  # only the ops no other op of their thread is open around, annotations and collectives

#: the args the observer formats, in torch's order (fragments of polyprof_observer_arg_fragments); the
#: last fragment is an object body of the extra args (kwargs, flops, Module Hierarchy), not one key
ARG_KEYS = (
    "Sequence number",
    "Fwd thread id",
    "Concrete Inputs",
    "Input type",
    "Input Strides",
    "Input Dims",
)
USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: torch's record_function ranges, written as user_annotation
FIELDS = (
    ("start", np.int64),
    ("end", np.int64),
    ("tid", np.int64),
    ("seq", np.int64),
    ("fwd_tid", np.int64),
    ("rf_tid", np.int64),
    ("name", np.int32),
    ("scope", np.uint8),
    ("handle", np.uint64),
    ("overload", np.int32),
    ("modules", np.int32),
)
MEMORY_FIELDS = ("ts", "ptr", "bytes", "total_allocated", "total_reserved", "device_type", "device_index", "tid")

_loaded: dict[str, Observer] = {}
_failed: dict[str, str] = {}
_when_loaded: list[Callable[[Observer], None]] = []


def when_loaded(callback: Callable[[Observer], None]) -> Callable[[], None]:
    """`callback(observer)` for each observer loaded from now on (the flight recorder's crash writer
    takes the observer's, torch being imported after the recorder started); returns the way to stop."""
    _when_loaded.append(callback)
    return lambda: _when_loaded.remove(callback) if callback in _when_loaded else None


class Observer:
    """The loaded library. One recording at a time per process."""

    def __init__(self, path: str) -> None:
        with open_trusted(path) as checked:  # exactly the file checked is loaded (see builder)
            lib = ctypes.CDLL(checked.path)
        lib.polyprof_observer_abi.restype = ctypes.c_int
        if lib.polyprof_observer_abi() != ABI_VERSION:
            raise BuildError(f"{path} speaks observer ABI {lib.polyprof_observer_abi()}, not {ABI_VERSION}")
        lib.polyprof_observer_error.restype = ctypes.c_char_p
        lib.polyprof_observer_barrier.restype = ctypes.c_char_p
        lib.polyprof_observer_start.argtypes = [ctypes.c_int]
        lib.polyprof_observer_start.restype = ctypes.c_int
        lib.polyprof_observer_stop.restype = ctypes.c_int64
        lib.polyprof_observer_take.argtypes = [ctypes.c_int64]
        lib.polyprof_observer_take.restype = ctypes.c_int64
        lib.polyprof_observer_names_size.restype = ctypes.c_int64
        lib.polyprof_observer_names.argtypes = [ctypes.c_void_p]
        lib.polyprof_observer_fill.argtypes = [ctypes.c_void_p] * len(FIELDS)
        lib.polyprof_observer_arg_fragments.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        lib.polyprof_observer_arg_fragments.restype = ctypes.c_void_p
        lib.polyprof_observer_extras.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        lib.polyprof_observer_extras.restype = ctypes.c_void_p
        lib.polyprof_observer_hierarchies.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        lib.polyprof_observer_hierarchies.restype = ctypes.c_void_p
        lib.polyprof_observer_memory_count.restype = ctypes.c_int64
        lib.polyprof_observer_memory_fill.argtypes = [ctypes.c_void_p]
        lib.polyprof_observer_open_ops.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
        lib.polyprof_observer_open_ops.restype = ctypes.c_int64
        lib.polyprof_torch_consumers.restype = ctypes.c_int
        lib.polyprof_note_collector_state.argtypes = [ctypes.c_int]
        lib.polyprof_rf_enter.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.polyprof_rf_enter.restype = ctypes.c_void_p
        lib.polyprof_rf_exit.argtypes = [ctypes.c_void_p]
        lib.polyprof_observer_use_runtime.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64] + [
            ctypes.c_void_p
        ] * 3
        lib.polyprof_observer_use_runtime.restype = ctypes.c_int
        self.lib = lib
        self.path = path
        self._use_runtime()

    def _use_runtime(self) -> None:
        """Lend the observer what polyprof's C extension has: its row chunks (faulted in ahead while
        recording) and its TSC clock's rate (the ops then share the recorder's clock at its cost)."""
        from polyprof import _native

        self._warm_chunks: Callable[[int], None] | None = None
        chunk_new, chunk_free, chunk_bytes = _native.row_chunk_functions()
        if not chunk_new:  # nothing to lend (no extension): the observer keeps its own
            return
        rate, refresh, sample = _native.tsc_clock_addresses()
        lent = self.lib.polyprof_observer_use_runtime(
            chunk_new, chunk_free, chunk_bytes, rate or None, refresh or None, sample or None
        )
        self._warm_chunks = _native.warm_row_chunks if lent == 0 else None

    def start(self, options: int = 0) -> None:
        """Start recording; `options` is a sum of RECORD_SHAPES, PROFILE_MEMORY, WITH_FLOPS,
        WITH_MODULES, ALL_THREADS, OVERLOAD_NAMES, TOP_LEVEL_ONLY."""
        from polyprof import _native

        _native.clock_ns()  # a clock pair: the TSC's rate measured, if it is not yet, for the ops' clock
        if self._warm_chunks is not None:  # the starting thread's first chunk of op rows, and with shapes
            self._warm_chunks(3 if options & RECORD_SHAPES else 1)  # two of shapes records (~72 B an op)
        if self.lib.polyprof_observer_start(int(options)) != 0:
            raise RuntimeError(self.lib.polyprof_observer_error().decode(errors="replace"))

    def barrier(self) -> str:
        """How the hand-over and stop see callbacks in progress, once started: ``"membarrier"`` (a
        callback's mark is a plain store) or ``"fence"`` (each callback pays a full fence)."""
        return self.lib.polyprof_observer_barrier().decode()

    def stop(self) -> int:
        """Stops recording; returns how many operators were recorded."""
        return int(self.lib.polyprof_observer_stop())

    def quiet_in_child(self) -> None:
        """In a forked child: recording off, taking no lock (a parent's thread may have held one)."""
        self.lib.polyprof_observer_quiet_in_child()

    def take(self, patience_us: int = 2000) -> int:
        """While recording: hand over what the threads have completed (waiting up to `patience_us` for
        each to be between operators); returns how many operators were taken."""
        return int(self.lib.polyprof_observer_take(int(patience_us)))

    def release(self) -> None:
        """Free what the last take handed over."""
        self.lib.polyprof_observer_release()

    def columns(self, n: int) -> tuple[dict[str, np.ndarray], list[str]]:
        """One array per field (start/end in host ns, end 0 for ops open at stop) and the name table."""
        cols = {name: np.empty(n, dtype=dtype) for name, dtype in FIELDS}
        if n:
            self.lib.polyprof_observer_fill(*(cols[name].ctypes.data for name, _ in FIELDS))
        size = int(self.lib.polyprof_observer_names_size())
        buf = ctypes.create_string_buffer(max(size, 1))
        self.lib.polyprof_observer_names(buf)
        names = buf.raw[: max(size - 1, 0)].decode(errors="replace").split("\0") if size else []
        return cols, names

    def arg_fragments(self, n: int) -> tuple[list[list[bytes]], list[bytes]]:
        """For each of ARG_KEYS, one JSON-encoded value per operator (in `columns` order), ``b""`` where
        torch writes no such key (no sequence number; no inputs, or record_shapes off); and per operator
        the body of a JSON object of its extra args (``b""``: none)."""
        size = ctypes.c_int64(0)
        ptr = self.lib.polyprof_observer_arg_fragments(ctypes.byref(size))
        fragments = ctypes.string_at(ptr, size.value).split(b"\0")  # one split in C, not 7n slices
        k = len(ARG_KEYS) + 1
        if len(fragments) != k * n + 1:  # each fragment ends in NUL: the last piece is empty
            raise RuntimeError(
                f"the observer wrote {len(fragments) - 1} arg fragments for {n} ops, not {k * n}"
            )
        return [fragments[i : k * n : k] for i in range(k - 1)], fragments[k - 1 : k * n : k]

    def extras(self) -> dict[int, bytes]:
        """The extra args of the operators that have any (collective args of ``record_param_comms``
        always; kwargs, flops, Module Hierarchy with their options), by operator index: JSON object
        bodies."""
        size = ctypes.c_int64(0)
        ptr = self.lib.polyprof_observer_extras(ctypes.byref(size))
        pieces = ctypes.string_at(ptr, size.value).split(b"\0")[:-1] if size.value else []
        return {int(pieces[k]): pieces[k + 1] for k in range(0, len(pieces) - 1, 2)}

    def hierarchies(self) -> list[bytes]:
        """The hierarchy table: by id (the ``modules`` column), each eager Module Hierarchy as a JSON
        string value."""
        size = ctypes.c_int64(0)
        ptr = self.lib.polyprof_observer_hierarchies(ctypes.byref(size))
        return ctypes.string_at(ptr, size.value).split(b"\0")[:-1] if size.value else []

    def memory(self) -> dict[str, np.ndarray]:
        """The allocator reports recorded with PROFILE_MEMORY: one column per MEMORY_FIELDS."""
        n = int(self.lib.polyprof_observer_memory_count())
        raw = np.zeros((n, len(MEMORY_FIELDS)), dtype=np.int64)
        if n:
            self.lib.polyprof_observer_memory_fill(raw.ctypes.data)
        return {name: raw[:, i].copy() for i, name in enumerate(MEMORY_FIELDS)}

    def reset(self) -> None:
        self.lib.polyprof_observer_reset()

    def note_collector_state(self, on: bool) -> None:
        """Mark torch's profiler state on this thread as polyprof's own (its collector path)."""
        self.lib.polyprof_note_collector_state(1 if on else 0)

    def bridge_addresses(self) -> tuple[int, int, int]:
        """C addresses of polyprof_torch_consumers, polyprof_rf_enter and polyprof_rf_exit."""
        addr = ctypes.cast
        return (
            int(addr(self.lib.polyprof_torch_consumers, ctypes.c_void_p).value or 0),
            int(addr(self.lib.polyprof_rf_enter, ctypes.c_void_p).value or 0),
            int(addr(self.lib.polyprof_rf_exit, ctypes.c_void_p).value or 0),
        )


    def open_ops(self, patience_us: int = 2000) -> list[tuple[int, int, str]]:
        """(tid, start, name) of each operator open now on a thread (while recording)."""
        room = 4096
        while True:
            out = ctypes.create_string_buffer(room)
            size = self.lib.polyprof_observer_open_ops(out, room, patience_us)
            if size <= room:
                break
            room = size * 2
        lines = out.raw[:size].decode("utf-8", "replace").splitlines()
        return [(int(tid), int(start), name) for tid, start, name in (line.split("\x1f", 2) for line in lines)]

    def crash_rows_address(self) -> int:
        """The C address of polyprof_observer_crash_rows (the ops not yet taken, written at a crash)."""
        return int(ctypes.cast(self.lib.polyprof_observer_crash_rows, ctypes.c_void_p).value or 0)


def loaded_observers() -> list[Observer]:
    """The observers this process has loaded."""
    return list(_loaded.values())


def disabled() -> bool:
    return os.environ.get("POLYPROF_TORCH_OBSERVER", "1").strip().lower() in ("0", "off", "false", "no")


def get(torch: Any) -> Observer:
    """The observer for the imported `torch`, built on first use. Raises BuildError (remembered per
    process, so a failed build is tried once)."""
    key = str(library_path(torch))
    if key in _failed:
        raise BuildError(_failed[key])
    if key not in _loaded:
        try:
            _loaded[key] = Observer(str(build(torch)))
        except (BuildError, OSError) as exc:
            _failed[key] = str(exc)
            raise BuildError(str(exc)) from exc
        for callback in list(_when_loaded):
            callback(_loaded[key])
    return _loaded[key]


def quiet_loaded_in_child() -> None:
    """In a forked child: recording off in every observer this process had loaded (none is loaded
    anew: only a loaded one can be recording)."""
    for loaded in _loaded.values():
        loaded.quiet_in_child()


def cached(torch: Any) -> Observer | None:
    """The observer for `torch` if it is loaded or already built, without building it (None otherwise)."""
    key = str(library_path(torch))
    if key in _loaded:
        return _loaded[key]
    if key in _failed or cached_library(torch) is None:
        return None
    try:
        return get(torch)
    except BuildError:
        return None
