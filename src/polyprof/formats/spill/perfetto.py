"""The spill as a Perfetto trace: for a ``.pftrace`` output, what a profile completes is appended as
Perfetto packets, so that the spill of a killed run opens in Perfetto as it is (and ``polyprof
recover`` reads it like any trace).

Each append (a flush's parts, a window's collected rows) is a self-contained trace on its own packet
sequence (its own interned names), with tracks whose uuids come from what they are, so the appended
pieces are one valid trace at every chunk boundary; the first holds the clock snapshot. The interface
is :class:`polyprof.formats.spill.file.SpillWriter`'s::

    writer = PerfettoSpill.create(".t.spill.pftrace", header)
    writer.append_parts(parts)
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import Any

from polyprof.formats.spill.file import SpillFile
from polyprof.model import CollectedPart


class PerfettoSpill(SpillFile):
    def __init__(self, path: str, fd: int, header: dict[str, Any]) -> None:
        super().__init__(path, fd)
        self._epoch = int(header.get("epoch_offset_ns", 0) or 0)
        self._sequence = 1
        self._clock_written = False
        self._appending = threading.Lock()

    @classmethod
    def create(cls, path: str, header: dict[str, Any]) -> PerfettoSpill:
        return cls(path, cls._open(path), header)

    def append_parts(self, parts: list[CollectedPart]) -> None:
        parts = [dataclasses.replace(p, status=copy.deepcopy(p.status)) for p in parts if len(p.activities) or len(p.counters)]
        if not parts:
            return
        from polyprof.formats.perfetto.write import iter_perfetto_chunks
        from polyprof.merge import merge

        starts = [int(p.activities["start"].min()) for p in parts if len(p.activities)]
        ends = [int(p.activities["end"].max()) for p in parts if len(p.activities)]
        counter_ts = [int(p.counters.columns["ts"].min()) for p in parts if len(p.counters)]
        window = (min(starts + counter_ts), max(ends + counter_ts + starts))
        trace = merge(parts, window=window, epoch_offset_ns=self._epoch, metadata={})
        with self._appending:  # one append at a time: the clock snapshot first in the file
            self._sequence += 1
            chunks = iter_perfetto_chunks(
                trace, sequence_id=self._sequence, stable_tracks=True, clock=not self._clock_written, metadata=False
            )
            self._write(b"".join(chunks), len(trace.activities))
            self._clock_written = True

    def append_window(self, info: dict[str, Any]) -> None:
        """Windows are not marked in a Perfetto spill (its slices carry their own times)."""
