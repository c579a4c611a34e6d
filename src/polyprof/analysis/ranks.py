"""Rank views of a distributed job: step times per rank, the slowest rank of each step, time in
collectives, and which ranks waited.

::

    from polyprof.analysis.ranks import rank_view
    view = rank_view(["traces/rank0.json.gz", "traces/rank1.json.gz"])   # paths, a folder, or Traces
    view.steps          # [StepRow(step=3, times_ns={0: ..., 1: ...}, slowest=1, behind_ns=...), ...]
    view.ranks          # [RankRow(rank=0, steps=..., mean_step_ns=..., collective_ns=..., waited_ns=...)]

A step is a ``ProfilerStep#N`` span (what ``prof.step()`` records, in polyprof's traces and
torch.profiler's alike). Collective time is the union of the intervals of collective operations on
each rank (``c10d::*``, ``record_param_comms``, ``gloo:*``, ``nccl:*`` ops and NCCL kernels), so nested
ones count once. Collectives synchronise the ranks, so every rank's step lasts about as long as the
slowest one's: the fast ranks wait inside the collectives. A step's *busy* time is therefore its
duration less its time in collectives, and the slowest rank of a step is the one with the most busy
time; a rank's ``waited_ns`` is its collective time above the least any rank spent.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyprof.analysis.intervals import union_ns
from polyprof.model import Trace
from polyprof.model.steps import step_rows

COLLECTIVE = re.compile(r"^(c10d::|record_param_comms$|gloo:|nccl:)|nccl.*kernel|ncclDevKernel", re.IGNORECASE)


@dataclass
class StepRow:
    step: int
    times_ns: dict[int, int]  # rank -> the step's duration
    busy_ns: dict[int, int]  # rank -> the step's duration less its time in collectives
    slowest: int  # the rank with the most busy time
    behind_ns: int  # its busy time above the median of the ranks


@dataclass
class RankRow:
    rank: int
    source: str
    steps: int
    mean_step_ns: float
    collective_ns: int
    waited_ns: int = 0


@dataclass
class RankView:
    ranks: list[RankRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)

    @property
    def slowest_rank(self) -> int | None:
        """The rank slowest in most steps (ties: the larger total lag)."""
        if not self.steps:
            return None
        counts: dict[int, list[int]] = {}
        for s in self.steps:
            counts.setdefault(s.slowest, []).append(s.behind_ns)
        return max(counts, key=lambda r: (len(counts[r]), sum(counts[r])))


def load_ranks(items: Iterable[Any]) -> tuple[list[Trace], list[str], list[int]]:
    """The traces `items` name (loaded Traces, files, folders of rank traces), where each came from, and
    each one's rank (its ``distributedInfo`` rank; their order when those are missing or repeated)."""
    from polyprof.formats import load_trace
    from polyprof.formats.common.job import rank_of, trace_files

    items = list(items)
    traces: list[Trace] = [i for i in items if isinstance(i, Trace)]
    sources = [f"trace {n}" for n in range(len(traces))]
    paths = [str(p) for p in items if not isinstance(p, Trace)]
    from polyprof import progress

    files = trace_files(paths) if paths else []
    advance = progress.task("traces read", total=len(files))
    for path in files:
        traces.append(load_trace(path))
        sources.append(path)
        advance(1)
    ranks = [rank_of(t, i) for i, t in enumerate(traces)]
    if len(set(ranks)) != len(ranks):
        ranks = list(range(len(traces)))
    return traces, sources, ranks


def rank_view(traces: Iterable[Any]) -> RankView:
    """The rank view of several ranks' traces (paths, folders, or loaded Traces)."""
    loaded, sources, ranks = load_ranks(traces)
    view = RankView()
    per_step: dict[int, dict[int, int]] = {}
    busy: dict[int, dict[int, int]] = {}
    for rank, source, trace in zip(ranks, sources, loaded, strict=True):
        acts = trace.activities
        names = acts.strings.strings
        codes = acts["name"] if len(acts) else np.zeros(0, np.int32)
        collective = np.isin(codes, [c for c, n in enumerate(names) if COLLECTIVE.search(n)])
        c_start, c_end = (acts["start"][collective], acts["end"][collective]) if len(acts) else (codes, codes)
        durations = []
        for step, row in step_rows(trace).items():  # the longest span of each step (one per thread)
            lo, hi = int(acts["start"][row]), int(acts["end"][row])
            per_step.setdefault(step, {})[rank] = hi - lo
            busy.setdefault(step, {})[rank] = hi - lo - union_ns(c_start, c_end, lo, hi)
            durations.append(hi - lo)
        view.ranks.append(
            RankRow(rank, source, len(durations), statistics.fmean(durations) if durations else 0.0,
                    union_ns(c_start, c_end) if len(acts) else 0)
        )
    least = min((r.collective_ns for r in view.ranks), default=0)
    for r in view.ranks:
        r.waited_ns = r.collective_ns - least
    view.ranks.sort(key=lambda r: r.rank)
    for step in sorted(per_step):
        work = busy[step]
        slowest = max(work, key=lambda k: work[k])
        view.steps.append(StepRow(step, dict(sorted(per_step[step].items())), dict(sorted(work.items())), slowest,
                                  int(work[slowest] - statistics.median(work.values()))))
    return view
