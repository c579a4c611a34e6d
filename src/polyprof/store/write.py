"""Write a job's traces into a store (see :mod:`polyprof.store.schema`): each rank converted in its own
process, several at once, its tables written as Parquet under ``TABLE/rank=N/``.

::

    stats = write_store(["traces/rank0.json", "traces/rank1.json"], "job.polyprof", jobs=4)
    stats.ranks, stats.rows            # [0, 1], {"activities": 312_004, ...}
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from polyprof import progress
from polyprof._version import __version__
from polyprof.errors import ConfigError
from polyprof.store.schema import MANIFEST, ROW_GROUP_ROWS, SCHEMA_NAME, SCHEMA_VERSION, TABLES


@dataclass
class StoreStats:
    path: str
    ranks: list[int] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    sources: dict[int, str] = field(default_factory=dict)


def _convert(source: str, position: int, out: str) -> tuple[int, dict[str, int], str]:
    """One rank's trace into `out` (the store being made): its rank, rows per table and source."""
    from polyprof.formats import load_trace
    from polyprof.store.rank_tables import rank_tables

    tables = rank_tables(load_trace(source), source=os.path.abspath(source), fallback_rank=position)
    return tables.rank, write_rank(tables, out), source


def write_rank(tables: Any, out: str) -> dict[str, int]:
    """A rank's tables (:class:`~polyprof.store.rank_tables.RankTables`) into the store folder `out`;
    rows written per table."""
    written = {}
    for name, table in tables.tables.items():
        folder = os.path.join(out, name, f"rank={tables.rank}")
        os.makedirs(folder, exist_ok=True)
        pq.write_table(table.cast(TABLES[name]), os.path.join(folder, "part-0.parquet"),
                       row_group_size=ROW_GROUP_ROWS, compression="zstd")  # fmt: skip
        written[name] = table.num_rows
    return written


def write_manifest(out: str, stats: StoreStats) -> None:
    """``store.json``: the schema's name and version, the ranks, rows per table, each rank's source."""
    manifest = {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, "written_by": f"polyprof {__version__}",
                "tables": sorted(TABLES), "ranks": stats.ranks, "rows": stats.rows,
                "sources": {str(r): s for r, s in sorted(stats.sources.items())}}  # fmt: skip
    with open(os.path.join(out, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def write_store(
    sources: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    jobs: int | None = None,
    overwrite: bool = False,
    on_rank: Callable[[int, str], Any] | None = None,
) -> StoreStats:
    """Convert `sources` (one trace per rank: polyprof's or torch.profiler's JSON, ``.pftrace``, gzip or
    not) into the store `out`, `jobs` ranks at a time (default: the CPUs). The store is written beside
    and moved into place at the end: a failure leaves no half store. `on_rank(rank, source)` is called
    as each rank is done (progress). Two traces of one rank are an error naming both."""
    from polyprof.tools.merge_ranks import trace_files

    files = trace_files([os.fspath(s) for s in sources])
    seen = set()
    for f in files:
        if os.path.realpath(f) in seen:
            raise ConfigError(f"{f} is named twice: give each rank's trace once")
        seen.add(os.path.realpath(f))
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not overwrite:
        raise ConfigError(f"{out} exists: choose another path, or --overwrite to replace it")
    parent = os.path.dirname(out) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".polyprof-store-", dir=parent)
    stats = StoreStats(out)
    advance = progress.task("ranks into the store", total=len(files))
    try:
        workers = max(1, min(jobs or os.cpu_count() or 1, len(files)))
        results = []
        if workers == 1:
            for i, f in enumerate(files):
                results.append(_convert(f, i, staging))
                advance(1)
                if on_rank:
                    on_rank(results[-1][0], f)
        else:
            with ProcessPoolExecutor(workers) as pool:
                futures = [pool.submit(_convert, f, i, staging) for i, f in enumerate(files)]
                for fut in futures:
                    results.append(fut.result())
                    advance(1)
                    if on_rank:
                        on_rank(results[-1][0], results[-1][2])
        for rank, rows, source in results:
            if rank in stats.sources:
                raise ConfigError(f"two traces say they are rank {rank}: {stats.sources[rank]} and {source}")
            stats.sources[rank] = source
            for name, n in rows.items():
                stats.rows[name] = stats.rows.get(name, 0) + n
        stats.ranks = sorted(stats.sources)
        write_manifest(staging, stats)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return stats
