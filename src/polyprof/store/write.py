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
    from polyprof.store.rank_tables import rank_tables

    tables = rank_tables(_load(source), source=os.path.abspath(source), fallback_rank=position)
    return tables.rank, write_rank(tables, out), source


def _load(source: str) -> Any:
    """A trace file, or a spill a killed process left (read as ``polyprof recover`` reads it)."""
    from polyprof.formats import load_trace
    from polyprof.formats.spill.file import FILE_MAGIC

    try:
        with open(source, "rb") as f:
            spill = f.read(len(FILE_MAGIC)) == FILE_MAGIC
    except OSError:
        spill = False  # load_trace says what is wrong with the path
    if spill:
        from polyprof.tools.recover import recover_trace

        return recover_trace(source)
    return load_trace(source)


def write_rank(tables: Any, out: str) -> dict[str, int]:
    """A rank's tables (:class:`~polyprof.store.rank_tables.RankTables`) into the store folder `out`
    (each file written beside and renamed into place); rows written per table."""
    import pyarrow.parquet as pq

    written = {}
    for name, table in tables.tables.items():
        folder = os.path.join(out, name, f"rank={tables.rank}")
        os.makedirs(folder, exist_ok=True)
        final = os.path.join(folder, "part-0.parquet")
        partial = f"{final}.{os.getpid()}.partial"
        pq.write_table(table.cast(TABLES[name]), partial, row_group_size=ROW_GROUP_ROWS, compression="zstd")
        os.replace(partial, final)
        written[name] = table.num_rows
    return written


def add_rank(trace: Any, out: str | os.PathLike, source: str = "") -> str:
    """`trace` (one rank's) into the store `out`, made if missing: what each rank of a job does when it
    writes ``-o job.polyprof`` (``polyprof run``, an ``on_trace_ready`` handler). Ranks write their own
    files; the manifest is updated under a lock, so ranks may finish at once (on a shared file system
    that honours ``flock``). A rank written again replaces its tables. Returns the store's path."""
    import fcntl

    from polyprof.store.rank_tables import rank_tables

    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{out} is a file, not a store: choose another path (a .polyprof folder)")
    os.makedirs(out, exist_ok=True)
    tables = rank_tables(trace, source=source or f"rank written by pid {os.getpid()}")
    rows = write_rank(tables, out)
    with open(os.path.join(out, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = _manifest_or_none(out) or {}
        sources = {int(r): str(v) for r, v in manifest.get("sources", {}).items()}
        by_rank = dict(manifest.get("rows_by_rank", {}))
        sources[tables.rank] = source or sources.get(tables.rank) or f"rank {tables.rank}"
        by_rank[str(tables.rank)] = rows
        totals = {t: sum(r.get(t, 0) for r in by_rank.values()) for t in TABLES}
        stats = StoreStats(out, ranks=sorted(sources), rows=totals, sources=sources)
        write_manifest(out, stats, rows_by_rank=by_rank)
    return out


def _manifest_or_none(out: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_manifest(out: str, stats: StoreStats, rows_by_rank: dict[str, dict[str, int]] | None = None) -> None:
    """``store.json`` (written beside and renamed into place): the schema's name and version, the ranks,
    rows per table (and per rank, where ranks add themselves), each rank's source."""
    manifest = {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, "written_by": f"polyprof {__version__}",
                "tables": sorted(TABLES), "ranks": stats.ranks, "rows": stats.rows,
                "sources": {str(r): s for r, s in sorted(stats.sources.items())}}  # fmt: skip
    if rows_by_rank is not None:
        manifest["rows_by_rank"] = rows_by_rank
    partial = os.path.join(out, f"{MANIFEST}.{os.getpid()}.partial")
    with open(partial, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(partial, os.path.join(out, MANIFEST))


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
