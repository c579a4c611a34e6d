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
    for i in np.unique(np.concatenate((cat, name))).tolist():
        code[i] = table.intern(texts[i] if i >= 0 else "")
    kind = np.zeros(len(texts) + 1, dtype=np.uint8)
    for i in np.unique(cat).tolist():
        kind[i] = int(kind_from_category(texts[i] if i >= 0 else ""))
    return table, code, kind
