"""The trace store: a job's traces as Parquet tables (one folder per table, one file per rank) that an
embedded engine (DuckDB) or a cluster engine (Spark) queries, and the analyses written once over them.

::

    from polyprof import store

    store.write_store(["rank0.json", "rank1.json"], "job.polyprof")
    job = store.open("job.polyprof")                     # DuckDB
    job.sql("select rank, count(*) from activities group by rank").df()
    job.blame().to_pandas()                              # who made everyone wait
    store.diff(store.open("before.polyprof"), job)       # what changed between two jobs
    store.blame(["rank0.json", "rank1.json"])            # the same blame of traces, without a store

The schema is :mod:`polyprof.formats.store.schema` (and ``docs/store.md``); pyarrow and duckdb are the
``polyprof[store]`` extra, pyspark the ``polyprof[spark]`` one.
"""

from __future__ import annotations

from polyprof._lazy import lazy_names
from polyprof.extras import require

require("store", "polyprof's trace store")  # before any store module imports pyarrow: one line, not a traceback

_LAZY = {
    "write_store": "polyprof.formats.store.write",
    "open": "polyprof.store.query",
    "Store": "polyprof.store.query",
    "diff": "polyprof.store.diff",
    "blame": "polyprof.store.traces",
}

__getattr__, __dir__ = lazy_names(globals(), _LAZY)

__all__ = list(_LAZY)
