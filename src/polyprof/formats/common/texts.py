"""The string table of rows whose category and name are indices into a reader's list of texts: only
the texts the rows name are interned, so that a chunk of a large file pays for its own strings, not for
every string read before it::

    table, code, kind = named_texts(texts, cat, name)
    columns["name"][:] = code[name]; columns["kind"][:] = kind[cat]
"""

from __future__ import annotations

import numpy as np

from polyprof.model import StringTable
from polyprof.model.kinds import kind_from_category


def named_texts(texts: list[str], cat: np.ndarray, name: np.ndarray) -> tuple[StringTable, np.ndarray, np.ndarray]:
    """(a table of the texts `cat` and `name` index, in the texts' order; each text's code in it; each
    text's kind as a category), the last two indexed like `texts`, with -1 standing for ""."""
    table = StringTable()
    code = np.zeros(len(texts) + 1, dtype=np.int32)
    for i in _used(len(texts), cat, name):
        code[i] = table.intern(texts[i] if i >= 0 else "")
    kind = np.zeros(len(texts) + 1, dtype=np.uint8)
    for i in _used(len(texts), cat):
        kind[i] = int(kind_from_category(texts[i] if i >= 0 else ""))
    return table, code, kind


def _used(n: int, *indices: np.ndarray) -> list[int]:
    """The indices (into n texts, -1 for "") that `indices` hold, ascending: a mask, not a sort of the
    rows (a large file's rows are millions)."""
    used = np.zeros(n + 1, dtype=bool)  # the last one stands for -1
    for values in indices:
        used[values] = True
    return ([-1] if used[n] else []) + np.flatnonzero(used[:n]).tolist()
