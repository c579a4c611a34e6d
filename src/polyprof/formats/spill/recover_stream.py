"""A spill's trace in pieces of time, never held whole: how a large spill streams into the store
(:mod:`polyprof.formats.store.rank_stream`)::

    for chunk in recover_pieces(".t.json.gz.spill", rows=50_000):
        chunk.trace, chunk.window   # rows of one span of time, merged as recover_trace merges the spill

The spill is read twice. The first pass decodes each part in turn and keeps what the cuts need: a
sample of its rows' starts, its operators' and annotations' spans (their union), its flow rows' ids and
starts. A cut at time T keeps the merge exact where none of the merge's links crosses it (a row goes
to the piece its start falls in):

- no flow has one end before T and the other at or after it (a flow missing an end is cleared);
- where the spill has launches, no operator or annotation is open at T (started before it, ending at or
  after it): launch attribution and device-side annotations look for the span open around a launch.

The second pass merges the pieces in time order, each from the parts' rows of its span (a part is
decoded once and kept while later pieces need it), with one merge report, so that the last piece's
backend statuses count every row, and the whole spill's flow-id shifts. Their rows, one after the
other, are the rows of :func:`~polyprof.formats.spill.recover.recover_trace` in its order; the counters come
last, in pieces of whole parts, in the parts' order. Memory: a piece's rows, the parts it needs, and
the first pass's facts (a start in eight, 17 bytes for each flow row, each part's spans as their union).
A spill without a cut (an annotation open from start to end over device work) is one piece: memory as
loading it.

A ring's spill with its older generation (``SPILL.previous``) raises :class:`Declined`: the ring
bounds it, and it is loaded whole. A Perfetto spill is a Perfetto trace, less a last packet cut off:
:func:`perfetto_spill_chunks`.

The one link the cuts do not guard: a launch whose backend names an operator that is not open around
it in time (it refines against that operator's start). No recorder writes such a launch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from polyprof.formats.common.chunk import Chunk
from polyprof.formats.common.declined import Declined
from polyprof.formats.perfetto.chunks import perfetto_chunks
from polyprof.formats.spill.file import read_part, read_spill
from polyprof.formats.spill.names import PREVIOUS
from polyprof.formats.spill.recover import Recovery, latest_statuses, perfetto_partial, read_crash_beside
from polyprof.merge import MergeContext, MergeReport, merge
from polyprof.merge.flows import backend_flow_offsets
from polyprof.model import ActivityKind, ActivityTable, CollectedPart, Counters

#: every how many rows of a part one start is kept to place the cuts
START_SAMPLE = 8
SPANS = (int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION))
LAUNCHES = (int(ActivityKind.RUNTIME), int(ActivityKind.DRIVER))
_NEVER = np.iinfo(np.int64).max


@dataclass
class _Part:
    """One part as the first pass saw it: where it is (or the part itself, for a crash's rows), its shell
    (everything but rows and counters) and its rows' extent."""

    shell: CollectedPart
    at: tuple[int, int] | None = None  # (offset, length) in the spill
    loaded: CollectedPart | None = None
    rows: int = 0
    first: int = _NEVER  # least start
    last: int = -_NEVER  # greatest start
    end: int = -_NEVER  # greatest end
    counters: int = 0


@dataclass
class _Facts:
    """What the first pass keeps of every part, for the cuts."""

    parts: list[_Part] = field(default_factory=list)
    starts: list[np.ndarray] = field(default_factory=list)
    spans: list[np.ndarray] = field(default_factory=list)  # (n, 2): a part's operators' and annotations' union
    flows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)  # backend, id*4+type, is start, start
    launches: bool = False
    flow_ids: dict[str, list[int]] = field(default_factory=dict)  # backend -> its least and greatest flow ids

    def add(self, part: CollectedPart, at: tuple[int, int] | None) -> None:
        acts = part.activities
        shell = dataclasses.replace(part, activities=ActivityTable.empty(), counters=Counters())
        seen = _Part(shell, at, None if at else part, len(acts), counters=len(part.counters))
        self.parts.append(seen)
        if not len(acts):
            return
        start, end, kind = acts["start"], acts["end"], acts["kind"]
        seen.first, seen.last, seen.end = int(start.min()), int(start.max()), int(end.max())
        self.starts.append(start[::START_SAMPLE].copy())
        self.launches = self.launches or bool(np.isin(kind, LAUNCHES).any())
        is_span = np.isin(kind, SPANS) & (end > start)
        if is_span.any():
            self.spans.append(_union(start[is_span], end[is_span]))
        fid = acts["flow_id"]
        has = fid != 0
        if has.any():
            ids = fid[has]
            self.flows.append((part.backend, ids * 4 + acts["flow_type"][has], acts["flow_start"][has] != 0,
                               start[has].copy()))
            known = self.flow_ids.setdefault(part.backend, [])
            self.flow_ids[part.backend] = [min(known + [int(ids.min())]), max(known + [int(ids.max())])]

    def cuts(self, rows: int, offsets: dict[str, int]) -> list[int]:
        """Times to cut at, about `rows` rows apart, that no link crosses (see the module)."""
        if not self.starts:
            return []
        starts = np.sort(np.concatenate(self.starts))
        step = max(1, rows // START_SAMPLE)
        wanted = starts[step::step]
        blocked = self._blocked(offsets)
        if not len(blocked):
            cuts = wanted
        else:
            comp = np.searchsorted(blocked[:, 0], wanted, side="left") - 1  # the last one starting before
            inside = (comp >= 0) & (wanted <= blocked[np.maximum(comp, 0), 1])
            cuts = np.where(inside, blocked[np.maximum(comp, 0), 1] + 1, wanted)
        cuts = np.unique(cuts)
        return [int(t) for t in cuts if starts[0] < t <= starts[-1]]

    def _blocked(self, offsets: dict[str, int]) -> np.ndarray:
        """The times no cut may take, as disjoint (start, end] spans, sorted."""
        pieces = [self._flow_spans(offsets)]
        if self.launches:
            pieces += self.spans
        pieces = [p for p in pieces if len(p)]
        return _union(*np.concatenate(pieces).T) if pieces else np.zeros((0, 2), dtype=np.int64)

    def _flow_spans(self, offsets: dict[str, int]) -> np.ndarray:
        """(first start, last start) of every flow that has both ends."""
        if not self.flows:
            return np.zeros((0, 2), dtype=np.int64)
        key = np.concatenate([k + offsets[b] * 4 for b, k, _, _ in self.flows])
        is_start = np.concatenate([s for _, _, s, _ in self.flows])
        start = np.concatenate([t for _, _, _, t in self.flows])
        order = np.argsort(key, kind="stable")
        key, is_start, start = key[order], is_start[order], start[order]
        heads = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        paired = np.maximum.reduceat(is_start, heads) & np.maximum.reduceat(~is_start, heads)
        lo, hi = np.minimum.reduceat(start, heads), np.maximum.reduceat(start, heads)
        keep = paired & (hi > lo)
        return np.stack([lo[keep], hi[keep]], axis=1)


def _union(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The (start, end] spans as disjoint spans, sorted; two spans with no time between them are one."""
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    heads = np.flatnonzero(np.concatenate(([True], start[1:] > reach[:-1])))
    return np.stack([start[heads], np.maximum.reduceat(end, heads)], axis=1)


def recover_pieces(path: str, rows: int, on_read: Callable[[int], None] | None = None) -> Iterator[Chunk]:
    """The trace of the spill at `path` in pieces of about `rows` rows (see the module). `on_read` is
    told how far through the file the two passes are (as bytes of the file, up to its size)."""
    path = os.fspath(path)
    if os.path.isfile(path + PREVIOUS):
        raise Declined(f"{path} has an older generation ({path + PREVIOUS}): a ring's spill is loaded whole")
    size = os.path.getsize(path)
    facts = _Facts()
    spill = read_spill(path, on_part=lambda part, offset, length: (
        facts.add(part, (offset, length)), on_read and on_read((offset + length) // 2)))
    statuses = latest_statuses([p.shell for p in facts.parts])
    crash = read_crash_beside(path)
    if crash is not None:
        from polyprof.formats.spill.crash import crash_parts

        for part in crash_parts(crash, statuses):
            facts.add(part, None)
    recovery = Recovery.of(path, spill, statuses, crash, [p.first for p in facts.parts if p.rows],
                           [p.end for p in facts.parts if p.rows])
    in_order = dict.fromkeys(p.shell.backend for p in facts.parts)  # as the merge takes them
    offsets = backend_flow_offsets({b: np.array(facts.flow_ids.get(b, []), dtype=np.int64) for b in in_order})
    report, context = MergeReport(), MergeContext.of([p.shell for p in facts.parts])

    def merged(parts: list[CollectedPart]) -> Chunk:
        trace = merge(parts, window=recovery.window, epoch_offset_ns=recovery.epoch_offset_ns,
                      metadata=recovery.metadata, report=report, flow_offsets=offsets, context=context)
        return Chunk(trace, window=recovery.window)

    bounds = [-_NEVER, *facts.cuts(rows, offsets), _NEVER]
    by_first = sorted((i for i, seen in enumerate(facts.parts) if seen.rows), key=lambda i: facts.parts[i].first)
    with open(path, "rb") as f:
        held: dict[int, CollectedPart] = {}  # the parts with rows in this piece or a later one
        taken = 0
        for k in range(len(bounds) - 1):
            lo, hi = bounds[k], bounds[k + 1]
            while taken < len(by_first) and facts.parts[by_first[taken]].first < hi:
                i = by_first[taken]
                held[i] = facts.parts[i].loaded or _read(f, facts.parts[i])
                taken += 1
            yield merged([_rows_between(facts.parts[i].shell, held[i], lo, hi) for i in sorted(held)])
            for i in [i for i in held if facts.parts[i].last < hi]:
                del held[i]
            if on_read is not None:
                on_read(size // 2 + (size - size // 2) * (k + 1) // (len(bounds) - 1))
        held.clear()
        for group in _counter_groups(facts.parts, rows):
            yield merged([dataclasses.replace(facts.parts[i].shell, counters=(facts.parts[i].loaded
                                              or _read(f, facts.parts[i])).counters) for i in sorted(group)])


def _read(f: BinaryIO, seen: _Part) -> CollectedPart:
    assert seen.at is not None
    return read_part(f, *seen.at)


def _rows_between(shell: CollectedPart, part: CollectedPart, lo: int, hi: int) -> CollectedPart:
    """`shell` with the rows of `part` that start in [lo, hi)."""
    start = part.activities["start"]
    return dataclasses.replace(shell, activities=part.activities.take(np.flatnonzero((start >= lo) & (start < hi))))


def _counter_groups(parts: list[_Part], rows: int) -> Iterator[set[int]]:
    """Consecutive parts with counters, about `rows` samples a group."""
    group: set[int] = set()
    held = 0
    for i, seen in enumerate(parts):
        if seen.counters:
            group.add(i)
            held += seen.counters
            if held >= rows:
                yield group
                group, held = set(), 0
    if group:
        yield group


def perfetto_spill_chunks(path: str, rows: int, on_read: Callable[[int], None] | None = None) -> Iterator[Chunk]:
    """A Perfetto spill (``.NAME.spill.pftrace``) as :func:`~polyprof.formats.perfetto.chunks.
    perfetto_chunks` reads a trace, a last packet cut off by the kill left out, the last chunk's metadata
    marked partial as :func:`~polyprof.formats.spill.recover.recover_trace` marks it. Raises
    :class:`~polyprof.formats.common.declined.Declined` where the scanner declines."""
    held: Chunk | None = None
    first, last = _NEVER, -_NEVER
    for chunk in perfetto_chunks(path, rows, on_read, tolerate_torn=True):
        acts = chunk.trace.activities
        if len(acts):
            first, last = min(first, int(acts["start"].min())), max(last, int(acts["end"].max()))
        if held is not None:
            yield held
        held = chunk
    assert held is not None and held.scanned is not None, "the last chunk says what was scanned"
    window = held.window or ((first, last) if first <= last else (0, 0))
    trace = held.trace
    trace.metadata["polyprof"] = perfetto_partial(trace.metadata, path, window, trace.epoch_offset_ns, held.scanned)
    yield held
