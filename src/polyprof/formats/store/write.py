"""Write a job's traces into a store (see :mod:`polyprof.formats.store.schema`): each rank converted in its own
process, several at once, its tables written as Parquet under ``TABLE/rank=N/``.

::

    stats = write_store(["traces/rank0.json", "traces/rank1.json"], "job.polyprof", jobs=4)
    stats.ranks, stats.rows            # [0, 1], {"activities": 312_004, ...}
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from polyprof import progress
from polyprof.errors import ConfigError
from polyprof.formats.store.files import StoreStats, write_manifest, write_rank

#: a JSON rank larger than this (a gzip file: ten times its size) streams into the store in bounded
#: memory; a smaller one is loaded whole, which takes less than the streaming's bound and half its time
STREAM_ABOVE_BYTES = 64 << 20


def _convert(source: str, position: int, out: str, advance: progress.Advance | None = None
             ) -> tuple[int, dict[str, int], str]:
    """One rank's trace into `out` (the store being made): its rank, rows per table and source. A
    large JSON or Perfetto rank, or a large spill, streams through (:mod:`polyprof.formats.store.rank_stream`),
    reporting the file's bytes read to `advance` as it goes; a smaller one is read whole."""
    if _inflated_size(source) > STREAM_ABOVE_BYTES and _streams(source):
        from polyprof.formats.store.rank_stream import stream_rank

        rank, rows = stream_rank(source, out, fallback_rank=position, on_read=advance)
        return rank, rows, source
    from polyprof.formats.files import open_chunks
    from polyprof.formats.store.rank_tables import rank_tables

    trace = next(open_chunks(source)).trace  # a trace file, or a spill read as `polyprof recover` reads it
    tables = rank_tables(trace, source=os.path.abspath(source), fallback_rank=position)
    return tables.rank, write_rank(tables, out), source


class _Read:
    """The bytes of each rank's file reported once: as a streamed rank reads them, the rest when done."""

    def __init__(self, advance: progress.Advance) -> None:
        self.advance, self.reported = advance, {}

    def of(self, source: str) -> progress.Advance:
        def report(read_so_far: float) -> None:
            more = read_so_far - self.reported.get(source, 0)
            if more > 0:
                self.reported[source] = read_so_far
                self.advance(more)

        return report

    def done(self, source: str, size: int) -> None:
        self.of(source)(size)


def _inflated_size(source: str) -> int:
    from polyprof.formats.common.source import is_gzip_file

    if not os.path.isfile(source):
        return 0  # loading it says what is wrong with the path
    return os.path.getsize(source) * (10 if is_gzip_file(source) else 1)


def _streams(source: str) -> bool:
    """Whether `source` is a JSON or Perfetto trace (a Perfetto spill is one) or a spill, from its first
    bytes."""
    from polyprof.formats.common.source import open_stream
    from polyprof.formats.perfetto.read import looks_like_perfetto
    from polyprof.formats.spill.names import is_spill_file

    if is_spill_file(source):
        return True
    try:
        with open_stream(source) as f:
            head = f.read(256)
    except Exception:  # noqa: BLE001 - loading it says what is wrong with the path
        return False
    return head.lstrip()[:1] in (b"{", b"[") or looks_like_perfetto(head)


def replaceable_store(path: str) -> None:
    """ConfigError unless `path` is a store of this user's (its folder, with its manifest) that
    ``--overwrite`` may remove: never a link, a file or any other folder."""
    from polyprof.formats.common.paths import MANIFEST
    from polyprof.formats.store.files import own_folder

    if os.path.islink(path) or not os.path.isdir(path):
        raise ConfigError(f"{path} is not a store folder (a {'link' if os.path.islink(path) else 'file'}): --overwrite "
                          "replaces only a store; remove it yourself, or choose another path")
    own_folder(path)
    if not os.path.isfile(os.path.join(path, MANIFEST)) or os.path.islink(os.path.join(path, MANIFEST)):
        raise ConfigError(f"{path} is not a polyprof store (no {MANIFEST}): --overwrite replaces only a store; remove "
                          "it yourself, or choose another path")


def write_store(
    sources: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    jobs: int | None = None,
    overwrite: bool = False,
) -> StoreStats:
    """Convert `sources` (one trace per rank: polyprof's or torch.profiler's JSON, ``.pftrace``, gzip or
    not) into the store `out`, `jobs` ranks at a time (default: the CPUs). The store is written beside
    and moved into place at the end: a failure leaves no half store. Each rank done is reported to
    :mod:`polyprof.progress`. Two traces of one rank are an error naming both."""
    from polyprof.formats.common.job import trace_files

    files = trace_files([os.fspath(s) for s in sources])
    seen = set()
    for f in files:
        if os.path.realpath(f) in seen:
            raise ConfigError(f"{f} is named twice: give each rank's trace once")
        seen.add(os.path.realpath(f))
    out = os.path.abspath(os.fspath(out))
    if os.path.lexists(out):
        if not overwrite:
            raise ConfigError(f"{out} exists: choose another path, or --overwrite to replace it")
        replaceable_store(out)
    parent = os.path.dirname(out) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".polyprof-store-", dir=parent)
    stats = StoreStats(out)
    sizes = [os.path.getsize(f) if os.path.isfile(f) else 0 for f in files]
    advance = progress.task("stored trace bytes", total=sum(sizes))
    try:
        workers = max(1, min(jobs or os.cpu_count() or 1, len(files)))
        results = []
        with contextlib.ExitStack() as stack:  # one process per rank at a time; none for one worker
            pool = stack.enter_context(ProcessPoolExecutor(workers)) if workers > 1 else None
            read = _Read(advance)  # in this process, a streamed rank reports its bytes as it reads them
            converted = (pool.map(_convert, files, range(len(files)), itertools.repeat(staging)) if pool else
                         map(_convert, files, range(len(files)), itertools.repeat(staging), map(read.of, files)))
            for result, size in zip(converted, sizes, strict=True):
                results.append(result)
                read.done(result[2], size)
        for rank, rows, source in results:
            if rank in stats.sources:
                raise ConfigError(f"two traces say they are rank {rank}: {stats.sources[rank]} and {source}")
            stats.sources[rank] = source
            for name, n in rows.items():
                stats.rows[name] = stats.rows.get(name, 0) + n
        stats.ranks = sorted(stats.sources)
        write_manifest(staging, stats)
        if os.path.lexists(out):
            replaceable_store(out)
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return stats
