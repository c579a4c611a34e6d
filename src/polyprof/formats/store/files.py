"""A store's files (:mod:`polyprof.formats.store.schema`): a rank's tables as Parquet, the manifest, and a rank
adding itself to a store, which is what writing a trace to a ``.polyprof`` path does::

    add_rank(trace, "job.polyprof")       # this rank's tables, the manifest updated under a lock
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from polyprof._version import __version__
from polyprof.errors import ConfigError
from polyprof.formats.common.paths import atomic_output, new_file_mode
from polyprof.formats.store.schema import MANIFEST, ROW_GROUP_ROWS, SCHEMA_NAME, SCHEMA_VERSION, TABLES


@dataclass
class StoreStats:
    path: str
    ranks: list[int] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    sources: dict[int, str] = field(default_factory=dict)


def write_rank(tables: Any, out: str) -> dict[str, int]:
    """A rank's tables (:class:`~polyprof.formats.store.rank_tables.RankTables`) into the store folder `out`
    (each file written beside and renamed into place); rows written per table."""
    import pyarrow.parquet as pq

    written = {}
    for name, table in tables.tables.items():
        with rank_file(out, name, tables.rank) as partial:
            pq.write_table(table.cast(TABLES[name]), partial, row_group_size=ROW_GROUP_ROWS, compression="zstd")
        written[name] = table.num_rows
    return written


def own_folder(path: str) -> str:
    """`path` made, or accepted where it exists: a real folder (not a link) of this user's that others
    may not write, so that nothing in it is planted by another user. ConfigError saying which not."""
    with contextlib.suppress(FileExistsError):
        os.makedirs(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path} is a link: give the store's own folder, not a link to it")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} is a file, not a store: choose another path (a .polyprof folder)")
    if st.st_uid != os.getuid():
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): a store is written only "
                          "into a folder of yours; choose another path")
    if st.st_mode & stat.S_IWOTH:
        raise ConfigError(f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod o-w it, or "
                          "choose another path")
    return path


@contextlib.contextmanager
def rank_file(out: str, table: str, rank: int) -> Iterator[str]:
    """The path to write a rank's file of `table` at: a new file of an unpredictable name beside its
    final path, renamed there when the block ends without an error (removed when it raises)."""
    folder = own_folder(os.path.join(own_folder(os.path.join(own_folder(out), table)), f"rank={int(rank)}"))
    final = os.path.join(folder, "part-0.parquet")
    fd, partial = tempfile.mkstemp(prefix=".part-0.parquet.", suffix=".partial", dir=folder)
    os.close(fd)
    try:
        yield partial
        os.chmod(partial, new_file_mode())
        os.replace(partial, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise


def add_rank(trace: Any, out: str | os.PathLike, source: str = "") -> str:
    """`trace` (one rank's) into the store `out`, made if missing: what each rank of a job does when it
    writes ``-o job.polyprof`` (``polyprof run``, an ``on_trace_ready`` handler). Ranks write their own
    files; the manifest is updated under a lock, so ranks may finish at once (on a shared file system
    that honours ``flock``). A rank written again replaces its tables. Returns the store's path."""
    import fcntl

    from polyprof.formats.store.rank_tables import rank_tables

    out = os.path.abspath(os.fspath(out))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    own_folder(out)
    tables = rank_tables(trace, source=source or f"rank written by pid {os.getpid()}")
    rows = write_rank(tables, out)
    lock_fd = os.open(os.path.join(out, ".lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(lock_fd, "w") as lock:
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
                "sources": {str(r): s for r, s in sorted(stats.sources.items())}}
    if rows_by_rank is not None:
        manifest["rows_by_rank"] = rows_by_rank
    with atomic_output(os.path.join(out, MANIFEST)) as f:
        f.write(json.dumps(manifest, indent=1).encode())
