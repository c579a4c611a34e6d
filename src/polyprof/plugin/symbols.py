"""Kernel names as torch.profiler writes them, for every device plugin: C++ symbols demangled by the C++
runtime's ``__cxa_demangle`` (through `cxxfilt`, which plugins that need it depend on), as Kineto does;
names that are not mangled C++ symbols (``cupy_sin__float32_float32``, Triton's ``add_kernel``) and
symbols it cannot read stay as they are.

    >>> demangle("_Z6squarePfi")
    'square(float*, int)'
    >>> demangle("cupy_sin__float32_float32")
    'cupy_sin__float32_float32'
"""

from __future__ import annotations

import functools

import numpy as np

from polyprof.model import CodedStrings

try:
    import cxxfilt
except ImportError as exc:  # a plain install has it; a broken one keeps mangled names, and says so
    cxxfilt = None
    _MISSING = f"cxxfilt is not importable ({exc}): pip install cxxfilt"  # names stay mangled
else:
    _MISSING = ""


def demangler_problem() -> str:
    """Why kernel names would stay mangled here ('' when they will not)."""
    if _MISSING:
        return _MISSING
    try:
        cxxfilt.demangle("_Z1fv")
    except cxxfilt.Error as exc:  # libstdc++ not found by ctypes
        return f"the C++ runtime's demangler is not available ({exc})"
    return ""


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """`name` demangled if it is a mangled C++ symbol, else unchanged."""
    if cxxfilt is None or not name.startswith("_Z"):
        return name
    try:
        return cxxfilt.demangle(name)
    except (cxxfilt.Error, UnicodeDecodeError):
        return name


def demangled(column: CodedStrings) -> CodedStrings:
    """A coded name column with its table demangled (each distinct name once); two symbols that read
    the same once demangled share one code."""
    index: dict[str, int] = {}
    remap = np.array([index.setdefault(demangle(n), len(index)) for n in column.table], dtype=np.int64)
    codes = np.asarray(column.codes)
    return CodedStrings(remap[codes] if len(remap) else codes, list(index))
