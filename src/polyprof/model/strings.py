"""Interned strings: each distinct name or category is stored once and referred to by index."""

from __future__ import annotations


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
