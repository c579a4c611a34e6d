"""Who made everyone wait, from several ranks' traces without a store: the store's ``blame`` analysis
(``store/sql/blame.sql``) run on the traces in memory (:meth:`Store.of_traces`), with DuckDB.

::

    from polyprof import store
    from polyprof.store.traces import blame_by_rank
    table = store.blame(["rank0.json", "rank1.json", ...])    # or loaded Traces, or a folder
    table.where(late_rank=2)                            # step, seq, op, wait_ns, cause, cause_ns, ...
    blame_by_rank(table)                                # rank -> the wait it cost the others in the steps

Needs the ``polyprof[store]`` extra (pyarrow and duckdb).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from polyprof.analysis.table import Table


def blame(traces: Iterable[Any]) -> Table:
    """One row per synchronizing collective instance and what its late rank was doing (see
    ``docs/store.md``), largest causes first within an instance."""
    from polyprof.analysis.ranks import load_ranks
    from polyprof.store.query import Store

    loaded, _, ranks = load_ranks(traces)
    result = Store.of_traces(loaded, ranks).blame()
    return Table.of_arrow(result, "who made everyone wait")


def blame_by_rank(table: Table) -> dict[int, int]:
    """Late rank -> the wait (ns) it cost the others, largest first; the set-up before the first step
    (``setup``) apart, as the overview counts it."""
    out: dict[int, int] = {}
    for row in table.dicts():
        if not row["setup"]:
            out[row["late_rank"]] = out.get(row["late_rank"], 0) + row["cause_ns"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
