"""The one kind of chunk every trace reader gives, and the one place a C scanner's decline is taken up
(see :func:`polyprof.formats.open_chunks`, which gives them)::

    for chunk in open_chunks("rank3.pftrace", rows=50_000):
        if chunk.restarted: ...      # the file is read again from its start: forget the chunks before
        chunk.trace, chunk.rows, chunk.window
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from polyprof.formats.common.declined import Declined
from polyprof.model import Trace


@dataclass
class Chunk:
    """Rows of a trace file (a partial Trace on the file's devices and threads as far as read; the last
    chunk's say what the whole file says of itself: its keys, devices and threads)."""

    trace: Trace
    #: each row's key in the whole file's row order (None: the order the chunks come in)
    rows: np.ndarray | None = None
    #: the window the file records (None: the rows' extent, which only the whole file gives)
    window: tuple[int, int] | None = None
    #: a Perfetto file's last chunk: (packets, packet sequences, bytes of a last packet cut off and left out)
    scanned: tuple[int, int, int] | None = None
    #: the first chunk of a second reading of the file, after chunks of the first were given (a C
    #: scanner declined part way): the chunks before it do not count
    restarted: bool = False


def falling_back(chunks: Callable[[], Iterable[Chunk]], otherwise: Callable[[], Iterable[Chunk]]) -> Iterator[Chunk]:
    """The chunks of `chunks()`, or where their reader declines (:class:`Declined`, before or after
    giving some) those of `otherwise()`, which reads the file again from its start; its first chunk
    then says it restarted if chunks were given before."""
    given = False
    try:
        for chunk in chunks():
            given = True
            yield chunk
        return
    except Declined:
        pass
    for n, chunk in enumerate(otherwise()):
        yield replace(chunk, restarted=True) if n == 0 and given else chunk


def whole(read: Callable[[], Trace]) -> Callable[[], Iterable[Chunk]]:
    """The chunks of a reader of whole traces: one chunk, the trace `read()` gives, with its window."""

    def chunks() -> Iterator[Chunk]:
        trace = read()
        yield Chunk(trace, window=trace.window)

    return chunks
