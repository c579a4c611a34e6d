"""polyprof's own PyTorch operator observer: RecordFunction callbacks in C++ writing per-thread columnar
buffers, read out in bulk after stop. It replaces torch's collector (``_enable_profiler`` /
``_disable_profiler``) for the common options, because stopping that collector alone takes longer than
polyprof's whole stop-to-trace budget.

::

    from polyprof.backends import torch_observer
    obs = torch_observer.get(torch)          # builds once per torch (see builder.py), then loads
    obs.start(record_shapes=False)
    ...                                      # run operators on this thread
    n = obs.stop()                           # same thread as start
    columns, names = obs.columns(n)
    obs.reset()

``POLYPROF_TORCH_OBSERVER=0`` turns it off (the torch backend then uses torch's collector).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from polyprof.backends.torch_observer.builder import BuildError, build, library_path

__all__ = ["BuildError", "Observer", "disabled", "get", "library_path"]

ABI_VERSION = 3
#: the args the observer formats, in torch's order (fragments of polyprof_observer_arg_fragments)
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
)

_loaded: dict[str, Observer] = {}
_failed: dict[str, str] = {}


class Observer:
    """The loaded library. One recording at a time per process."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.polyprof_observer_abi.restype = ctypes.c_int
        if lib.polyprof_observer_abi() != ABI_VERSION:
            raise BuildError(f"{path} speaks observer ABI {lib.polyprof_observer_abi()}, not {ABI_VERSION}")
        lib.polyprof_observer_error.restype = ctypes.c_char_p
        lib.polyprof_observer_start.argtypes = [ctypes.c_int]
        lib.polyprof_observer_start.restype = ctypes.c_int
        lib.polyprof_observer_stop.restype = ctypes.c_int64
        lib.polyprof_observer_names_size.restype = ctypes.c_int64
        lib.polyprof_observer_names.argtypes = [ctypes.c_void_p]
        lib.polyprof_observer_fill.argtypes = [ctypes.c_void_p] * len(FIELDS)
        lib.polyprof_observer_arg_fragments.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        lib.polyprof_observer_arg_fragments.restype = ctypes.c_void_p
        self.lib = lib
        self.path = path

    def start(self, record_shapes: bool = False) -> None:
        if self.lib.polyprof_observer_start(1 if record_shapes else 0) != 0:
            raise RuntimeError(self.lib.polyprof_observer_error().decode(errors="replace"))

    def stop(self) -> int:
        """Stops recording; returns how many operators were recorded."""
        return int(self.lib.polyprof_observer_stop())

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

    def arg_fragments(self, n: int) -> list[list[bytes]]:
        """For each of ARG_KEYS, one JSON-encoded value per operator (in `columns` order); ``b""`` where
        torch writes no such key (no sequence number; no inputs, or record_shapes off)."""
        size = ctypes.c_int64(0)
        ptr = self.lib.polyprof_observer_arg_fragments(ctypes.byref(size))
        fragments = ctypes.string_at(ptr, size.value).split(b"\0")  # one split in C, not 6n slices
        k = len(ARG_KEYS)
        if len(fragments) != k * n + 1:  # each fragment ends in NUL: the last piece is empty
            raise RuntimeError(
                f"the observer wrote {len(fragments) - 1} arg fragments for {n} ops, not {k * n}"
            )
        return [fragments[i : k * n : k] for i in range(k)]

    def reset(self) -> None:
        self.lib.polyprof_observer_reset()


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
    return _loaded[key]
