"""Interned strings: each distinct name or category is stored once and referred to by index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from polyprof import _native


class StringTable:
    """Maps strings to small ints and back.

    >>> t = StringTable()
    >>> t.intern("aten::mm"), t.intern("aten::add"), t.intern("aten::mm")
    (0, 1, 0)
    >>> t[1]
    'aten::add'
    """

    __slots__ = ("_ids", "_strings")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._strings: list[str] = []

    def intern(self, s: str) -> int:
        i = self._ids.get(s)
        if i is None:
            i = self._ids[s] = len(self._strings)
            self._strings.append(s)
        return i

    def __getitem__(self, i: int) -> str:
        return self._strings[i]

    def __len__(self) -> int:
        return len(self._strings)

    @property
    def strings(self) -> list[str]:
        return self._strings


def code_strings(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """``(codes, table)`` with ``table[codes[i]] == values[i]``: each distinct value once in `table`
    (first-seen order)."""
    return _native.code_strings(values)


def present_rows(values: Sequence[Any]) -> np.ndarray:
    """The positions (int64) of the entries of `values` that are not None."""
    return _native.present_rows(values)


def as_name(value: Any) -> str:
    """A name for the trace: `value` itself when it is a string, else its str() (or, when that raises,
    its type), so that no name handed over can stop a trace from being written."""
    if type(value) is str:
        return value
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"
