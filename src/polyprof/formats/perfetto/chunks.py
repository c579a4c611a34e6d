"""A Perfetto trace (``.pftrace``) read in chunks of rows, neither its bytes nor its records ever held
whole: how a large Perfetto rank streams into the store (:mod:`polyprof.formats.store.rank_stream`).

::

    for chunk in perfetto_chunks("rank3.pftrace", rows=50_000):
        chunk.trace, chunk.rows      # a partial trace, and each row's key in the whole file's row order

The file is read twice. The first pass keeps only the track descriptors, the clock and polyprof's
metadata event (its layout names every device and row, and the window); the second hands the events
over as the C scanner finishes them (``_native.scan_packets_take``): instants and counter values as
they come, a slice when its end comes (one still open stays in the scanner, with its annotations).
Every chunk is a Trace on the same devices and rows, its rows in the reader's order; their keys order
the rows of all chunks as :func:`polyprof.formats.load_trace` orders the rows of one start and end
(slices by the order they ended, then instants, then slices never closed, which the reader sorts as
ending where they begin). The last chunk holds the slices never closed, ended at the trace's last
time as the reader ends them.

Another writer's trace (no layout) is placed by its descriptors, as the reader places it (a track
without a row gets one when it is met); its window is then its rows' extent (``Chunk.window`` is
None). Raises :class:`~polyprof.formats.common.declined.Declined` where the scanner declines: the
reference reader then reads the file whole and names what is wrong with it
(:func:`polyprof.formats.open_chunks` does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from polyprof import _native
from polyprof.formats.common.chunk import Chunk
from polyprof.formats.common.source import disk_position, open_stream
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto.read import layout_window
from polyprof.formats.perfetto.scan import (
    PF_DTYPE,
    ArgsOf,
    Declined,
    Places,
    check_legacy,
    row_order,
    rows_trace,
    scan_pieces,
    scanned_head,
)
from polyprof.formats.perfetto.write import METADATA_EVENT, METADATA_TRACK

#: bytes read from the file at a time
READ_BYTES = 4 << 20
#: bytes handed to the scanner at a time (a chunk is taken once it holds `rows` records)
FEED_BYTES = 256 << 10
_GROUP = 61  # a key's group (slices ended, instants, slices open) above its order within the group


def perfetto_chunks(path: str, rows: int, on_read: Callable[[int], None] | None = None,
                    tolerate_torn: bool = False) -> Iterator[Chunk]:
    """The Perfetto trace `path` (gzip or not) as chunks of about `rows` rows (see the module). `on_read`
    is told the file's bytes read on disk as the second pass reads it. With `tolerate_torn` (a spill
    whose writer was killed), a last packet cut off is left out, as ``polyprof recover`` leaves it."""
    head = _Head.of(path, tolerate_torn)
    scanner = _native.packet_scanner(False, tolerate_torn)
    if scanner is None:
        raise Declined
    texts: list[str] = []
    last = 0
    with open_stream(path) as f:
        while piece := f.read(READ_BYTES):
            for at in range(0, len(piece), FEED_BYTES):
                held = _native.scan_packets_feed(scanner, piece[at : at + FEED_BYTES])
                if held < 0:
                    raise Declined
                if held >= rows:
                    chunk = head.chunk(_native.scan_packets_take(scanner), texts, last)
                    last = max(last, int(chunk.trace.activities["end"].max(initial=0)))
                    yield chunk
            if on_read is not None:
                on_read(disk_position(f))
    counts = _native.scan_packets_counts(scanner)
    yield replace(head.chunk(_native.scan_packets_take(scanner, True), texts, last), scanned=counts)


@dataclass
class _Head:
    """What the first pass reads: the reader holding the tracks, clock and metadata; the places; the
    window the file records (None: the rows' extent)."""

    reader: Any
    places: Places
    metadata_tracks: np.ndarray
    window: tuple[int, int] | None

    @classmethod
    def of(cls, path: str, tolerate_torn: bool = False) -> _Head:
        with open_stream(path) as f:
            found = scan_pieces(iter(lambda: f.read(READ_BYTES), b""), metadata_only=True, tolerate_torn=tolerate_torn)
        if found is None:
            raise Declined
        try:
            reader = scanned_head(found, path)[0]
            meta, layout = reader.meta_and_layout()
            places = Places(*reader.places(layout), meta, layout)
        except Exception:  # noqa: BLE001 - the reference reader gives the error, with its packet
            raise Declined from None
        tracks = [uuid for uuid, track in reader.tracks.items() if track.name == METADATA_TRACK]
        return cls(reader, places, np.array(tracks, dtype=np.uint64), layout_window(layout))

    def chunk(self, taken: Any, texts: list[str], last: int) -> Chunk:
        """The Chunk of what the scanner handed over (`texts` grows with its strings; `last`: the latest
        end of the chunks before, where slices never closed end)."""
        if taken is None:
            raise Declined
        try:
            return self._chunk(taken, texts, last)
        except Exception:  # noqa: BLE001 - the reference reader gives the error, with its packet
            raise Declined from None

    def _chunk(self, taken: Any, texts: list[str], last: int) -> Chunk:
        raw, global_index, strings, blocks, legacy = taken
        check_legacy(legacy)
        texts.extend(b.decode() for b in strings[len(texts) :])
        recs = np.frombuffer(raw, dtype=PF_DTYPE)
        meta_rows = self._metadata_instants(recs, texts)
        rows, ends = row_order(recs, meta_rows, last)
        trace = rows_trace(self.reader, self.places, recs, rows, ends, texts, ArgsOf(blocks, texts))
        return Chunk(trace, _keys(recs[rows], np.frombuffer(global_index, dtype=np.int64)[rows]), self.window)

    def _metadata_instants(self, recs: np.ndarray, texts: list[str]) -> np.ndarray:
        """The records of polyprof's metadata event (an instant of that name on the metadata track)."""
        try:
            name = texts.index(METADATA_EVENT)
        except ValueError:
            return np.zeros(0, dtype=np.int64)
        found = (recs["type"] == F.TYPE_INSTANT) & (recs["name"] == name) & np.isin(recs["track"], self.metadata_tracks)
        if (recs["has_ext_key"][found] != 0).any():
            raise Declined  # the reader keeps that key in the metadata; rows lose it
        return np.flatnonzero(found)


def _keys(recs: np.ndarray, global_index: np.ndarray) -> np.ndarray:
    """Each row's key: (group, order in it) in one int64, as the reader orders rows of one start and end."""
    closed = (recs["type"] == F.TYPE_SLICE_BEGIN) & (recs["end_order"] >= 0)
    unclosed = (recs["type"] == F.TYPE_SLICE_BEGIN) & ~closed
    slot = recs["open_slot"].astype(np.int64)
    if len(global_index) and (int(global_index.max()) >= 1 << 32 or int(slot.max()) >= 1 << (_GROUP - 32)):
        raise Declined  # past what one key holds (4G events): the file loads whole
    later = np.where(unclosed, (2 << _GROUP) | (slot << 32) | global_index, (1 << _GROUP) | global_index)
    return np.where(closed, recs["end_order"].astype(np.int64), later)
