"""The store's analyses on DuckDB a batch of ranks at a time, so that a job of a thousand ranks is
answered in the memory of a few.

Most analyses are *rank-local*: a rank's rows of them read only that rank's activities (its steps,
kernels, operators, device busy intervals...). Run over the whole store they sort and window every
rank's rows at once, and the working set grows with the job. Here they are computed for a batch of
ranks (about :data:`BATCH_ROWS` activities: one rank's file read once, into memory), kept, and the
next batch taken; the analyses across ranks (``clock``, ``blame``, ``rank_steps``, ``rank_totals``,
``overview``) then read those small tables. The answer is the same, row for row, as the whole-store
query's (``tests/store/test_store_plan.py``)::

    plan = RankPlan(con, activities_of, analysis_sql, ANALYSES, rows_by_rank)
    plan.prepare("select * from overview")   # computes steps, kernels, operators... rank batch by batch
    con.sql("select * from overview")        # reads them
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from polyprof import progress

#: the analyses whose rows of a rank read that rank's activities only, in the order they read each other
RANK_LOCAL = ("step_spans", "collective_ops", "islands", "launches", "outer_rows", "kernels", "temporal", "idle",
              "overlap", "launch", "steps", "operators")
#: activities a batch holds: one rank of a large trace, or many small ones (a query's cost per batch is
#: ~10 ms whatever its size, so a thousand ranks of 20 k rows go ~50 at a time)
BATCH_ROWS = 1_000_000
#: the activities columns no analysis reads (JSON text: the largest), left on disk
UNREAD = ("args", "input_dims", "input_types")

_NAMES = re.compile(r"\b(?:from|join)\s+([a-z_]+)", re.IGNORECASE)
_DEFINED = re.compile(r"\b([a-z_]+)\s+as\s*\(", re.IGNORECASE)


def reads(sql: str) -> set[str]:
    """The tables and views `sql` reads: the names after ``from`` and ``join`` that are not its own
    common table expressions (``with islands as (...)`` shadows the analysis of that name)."""
    return {n.lower() for n in _NAMES.findall(sql)} - {n.lower() for n in _DEFINED.findall(sql)}


def batches(rows_by_rank: Iterable[tuple[int, int]], limit: int = BATCH_ROWS) -> list[list[int]]:
    """Ranks grouped in order so that each group holds at most `limit` rows (a larger rank: alone)."""
    groups: list[list[int]] = []
    held = limit
    for rank, rows in rows_by_rank:
        if held + rows > limit or not groups:
            groups.append([])
            held = 0
        groups[-1].append(rank)
        held += rows
    return groups


class RankPlan:
    """Computes the analyses a query needs once, the rank-local ones batch by batch, on the DuckDB
    connection `con`.

    `activities_of(ranks)` is the SQL that reads those ranks' activities; `view_sql(name)` an analysis's
    SQL; `analyses` their names, each after those it reads; `rows_by_rank` each rank's activity count.
    Afterwards each analysis computed is a view of its kept table, and ``activities`` the whole store's."""

    def __init__(self, con: Any, activities_of: Callable[[list[int]], str], view_sql: Callable[[str], str],
                 analyses: Sequence[str], rows_by_rank: list[tuple[int, int]]) -> None:
        self.con, self.activities_of, self.view_sql = con, activities_of, view_sql
        self.analyses = tuple(analyses)
        self.rows_by_rank = rows_by_rank
        self.done: set[str] = set()

    def needed(self, sql: str) -> list[str]:
        """The analyses `sql` reads, directly or through other analyses, not yet computed, in the order
        they read each other (:attr:`analyses`' order)."""
        seen: set[str] = set()
        todo = list(reads(sql))
        while todo:
            name = todo.pop()
            if name not in seen and name in self.analyses and name not in self.done:
                seen.add(name)
                todo.extend(reads(self.view_sql(name)))
        return [name for name in self.analyses if name in seen]

    def prepare(self, sql: str) -> None:
        """Compute the analyses `sql` needs and keep them: the rank-local ones rank batch by batch
        (reported to :mod:`polyprof.progress` as "ranks analysed"), then those across ranks from them.
        On an error each analysis not kept is its whole-store view again."""
        names = self.needed(sql)
        local = [name for name in names if name in RANK_LOCAL]
        kept: list[str] = []
        try:
            if local:
                self._by_batches(local)
                kept += local
            for name in names:
                if name not in RANK_LOCAL:
                    self.con.execute(f"create or replace temp table _kept_{name} as {self.view_sql(name)}")
                    self.con.execute(f"create or replace view {name} as select * from _kept_{name}")
                    kept.append(name)
        finally:
            self.done.update(kept)

    def _by_batches(self, names: list[str]) -> None:
        advance = progress.task("ranks analysed", total=len(self.rows_by_rank))
        con, whole = self.con, False
        try:
            for i, ranks in enumerate(batches(self.rows_by_rank)):
                con.execute(f"create or replace temp table _batch_activities as "
                            f"select * exclude ({', '.join(UNREAD)}) from ({self.activities_of(ranks)})")
                con.execute("create or replace view activities as select * from _batch_activities")
                for name in names:  # in order: each reads the batch's tables of those before it
                    con.execute(f"create or replace temp table _batch_{name} as {self.view_sql(name)}")
                    con.execute(f"create or replace view {name} as select * from _batch_{name}")
                    into = f"create or replace temp table _kept_{name} as" if i == 0 else f"insert into _kept_{name}"
                    con.execute(f"{into} select * from _batch_{name}")
                advance(len(ranks))
            whole = True
        finally:
            con.execute(f"create or replace view activities as {self.activities_of([r for r, _ in self.rows_by_rank])}")
            for name in names:
                source = f"select * from _kept_{name}" if whole else self.view_sql(name)
                con.execute(f"create or replace view {name} as {source}")
                con.execute(f"drop table if exists _batch_{name}")
                if not whole:
                    con.execute(f"drop table if exists _kept_{name}")
            con.execute("drop table if exists _batch_activities")
