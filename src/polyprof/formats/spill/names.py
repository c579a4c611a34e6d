"""How a spill is known: a polyprof spill by its first bytes, a Perfetto spill (the spill of a
``.pftrace`` output, a Perfetto trace itself) by its name. Readers of traces ask here, without importing
the spill's reader::

    if is_spill_file(path) or is_perfetto_spill(path): ...   # read it as `polyprof recover` does
"""

from __future__ import annotations

import os

#: the first bytes of a polyprof spill (see :mod:`polyprof.formats.spill.file`)
FILE_MAGIC = b"POLYPROF-SPILL 1\n"
#: how a Perfetto spill's name ends: its bytes are a Perfetto trace's, without an end marker
PERFETTO_SPILL_SUFFIX = ".spill.pftrace"
#: a ring's spill keeps its older generation beside it under this suffix (``polyprof recover`` reads both)
PREVIOUS = ".previous"


def is_spill_file(path: str) -> bool:
    """Whether `path` starts as a spill does (a file that cannot be read is not one)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(FILE_MAGIC)) == FILE_MAGIC
    except OSError:
        return False


def is_perfetto_spill(path: str) -> bool:
    """Whether `path` is named as a Perfetto spill (read it with ``polyprof recover``: its last packet may
    be cut short by the kill that left it)."""
    return os.path.basename(path).endswith(PERFETTO_SPILL_SUFFIX)
