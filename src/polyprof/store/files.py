"""A store's files (:mod:`polyprof.store.schema`): a rank's tables as Parquet, the manifest, and a rank
adding itself to a store, which is what writing a trace to a ``.polyprof`` path does::

    add_rank(trace, "job.polyprof")       # this rank's tables, the manifest updated under a lock
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from polyprof._version import __version__
from polyprof.errors import ConfigError
from polyprof.store.schema import MANIFEST, ROW_GROUP_ROWS, SCHEMA_NAME, SCHEMA_VERSION, TABLES


@dataclass
class StoreStats:
    path: str
    ranks: list[int] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    sources: dict[int, str] = field(default_factory=dict)


def write_rank(tables: Any, out: str) -> dict[str, int]:
    """A rank's tables (:class:`~polyprof.store.rank_tables.RankTables`) into the store folder `out`
    (each file written beside and renamed into place); rows written per table."""
    import pyarrow.parquet as pq

    written = {}
    for name, table in tables.tables.items():
        with rank_file(out, name, tables.rank) as partial:
            pq.write_table(table.cast(TABLES[name]), partial, row_group_size=ROW_GROUP_ROWS, compression="zstd")
        written[name] = table.num_rows
    return written


@contextlib.contextmanager
def rank_file(out: str, table: str, rank: int) -> Iterator[str]:
    """The path to write a rank's file of `table` at: beside its final path, renamed there when the
    block ends without an error (removed when it raises)."""
    folder = os.path.join(out, table, f"rank={rank}")
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, "part-0.parquet")
    partial = f"{final}.{os.getpid()}.partial"
    try:
        yield partial
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    os.replace(partial, final)


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
