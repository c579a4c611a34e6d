"""One rank's trace (Chrome JSON, Perfetto, or a spill a killed run left) into the store in bounded
memory, whatever the trace's size: the same tables as :func:`~polyprof.formats.store.rank_tables.rank_tables`
of the loaded trace, row for row.

The file is read in chunks of rows (:func:`polyprof.formats.open_chunks`: a Perfetto file's rows come
as their slices end, a spill's merged a span of time at a time); each
chunk's rows go to a scratch Parquet file with what they say alone (names, args, kind of work), and what
only the whole file says is kept small beside: the steps' spans, operators per thread, the collectives'
args. DuckDB, under a memory limit and spilling to the scratch folder, then sorts the rows by thread
for their nesting levels (a stack carried from batch to batch), joins device rows to their launch's
step, and sorts the result by step for the store's row groups. Memory: one chunk, DuckDB's limit, one
row group, and the per-step and per-collective facts (a few bytes each).

::

    rank, rows = stream_rank("rank3.json.gz", "job.polyprof.staging", fallback_rank=3)
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from polyprof.formats.common.chunk import Chunk
from polyprof.formats.common.job import rank_of, recorded_offset
from polyprof.formats.files import open_chunks
from polyprof.formats.store import rank_tables as rt
from polyprof.formats.store.files import rank_file, write_rank
from polyprof.formats.store.rank_args import args_columns
from polyprof.formats.store.schema import ACTIVITIES, COUNTERS, ROW_GROUP_ROWS, TABLES
from polyprof.model import ActivityBuilder, ActivityKind, Counters, Trace
from polyprof.model.steps import step_rows

#: rows read per chunk (two chunks' columns and args are what the reader holds at once)
CHUNK_EVENTS = 50_000
#: rows the engine hands back at a time for the nesting levels (the stack is carried between them)
ENGINE_BATCH_ROWS = ROW_GROUP_ROWS
#: DuckDB's memory limit for one rank's sorts and joins (it spills past it)
ENGINE_MEMORY_MB = 256
_MIN = np.iinfo(np.int64).min

SCRATCH = pa.schema([
    ("row", pa.int64()), ("kind", pa.int8()), ("category", pa.string()), ("name", pa.string()),
    ("device", pa.int32()), ("resource", pa.int32()), ("start", pa.int64()), ("end", pa.int64()),
    ("correlation", pa.int64()), ("external_id", pa.int64()), ("flow_id", pa.int64()), ("flow_type", pa.int8()),
    ("flow_start", pa.bool_()), ("collective", pa.bool_()), ("work", pa.string()), ("input_dims", pa.string()),
    ("input_types", pa.string()), ("args", pa.string()), ("skip", pa.bool_()), ("on_device", pa.bool_()),
])


@dataclass
class _Facts:
    """What only the whole file says, gathered chunk by chunk (small: per step, thread, collective)."""

    steps: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # n -> (dur, start, end, row key)
    step_resource: dict[int, int] = field(default_factory=dict)  # a step span's row -> its thread
    ops: dict[int, int] = field(default_factory=dict)  # thread -> operators
    collectives: list[rt.CollectiveRow] = field(default_factory=list)
    rows: int = 0
    window: tuple[int, int] | None = None
    counters: int = 0


def stream_rank(source: str, out: str, *, fallback_rank: int = 0, chunk_events: int | None = None,
                memory_mb: int = ENGINE_MEMORY_MB, on_read: Callable[[int], None] | None = None
                ) -> tuple[int, dict[str, int]]:
    """`source` (one rank's Chrome JSON or Perfetto trace, gzip or not, or what a killed run left) into
    the store folder `out`: the rank and the rows written per table. `on_read` is told the file's bytes
    read so far (on disk) as it is read (from 0 again where a reading restarts). A file a C scanner
    declines is read by the reference reader (:func:`polyprof.formats.open_chunks`): a Perfetto file or
    a ring's spill whole, as one chunk (the reader names what is wrong with a malformed one)."""
    scratch = tempfile.mkdtemp(prefix=".polyprof-rank-", dir=out)
    try:
        facts, head = _read(source, scratch, chunk_events or CHUNK_EVENTS, on_read)
        pa.default_memory_pool().release_unused()  # the chunks' buffers, before the engine takes its share
        offset, uncertainty = recorded_offset(head)
        shift = head.epoch_offset_ns + (offset or 0)
        steps = _steps(facts)
        rank = rank_of(head, fallback_rank)
        written = {}
        written["activities"] = _write_activities(scratch, out, rank, head, facts, steps, shift, memory_mb)
        written["counters"] = _write_counters(scratch, out, rank, steps, shift)
        small = rt.RankTables(rank, {
            "collectives": rt.collectives_table(facts.collectives, steps, shift),
            "backends": rt.backends_table(head),
            "ranks": rt.rank_row(head, os.path.abspath(source), shift, offset, uncertainty, events=facts.rows),
        })
        written.update(write_rank(small, out))
        return rank, {name: written[name] for name in TABLES}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read(source: str, scratch: str, chunk_events: int, on_read: Callable[[int], None] | None
          ) -> tuple[_Facts, Trace]:
    """Every chunk's rows into the scratch files; the facts, and the file's head (its metadata, devices
    and threads, with no rows). Where the reading restarts (a C scanner declined part way), the rows
    written so far are written again from the restarted chunk on."""
    chunks = open_chunks(source, chunk_events, on_read=on_read)
    while True:
        try:
            return _read_chunks(chunks, scratch)
        except _ReadAgain as again:
            chunks = itertools.chain([again.chunk], chunks)


class _ReadAgain(Exception):
    def __init__(self, chunk: Chunk) -> None:
        self.chunk = chunk


def _read_chunks(chunks: Iterator[Chunk], scratch: str) -> tuple[_Facts, Trace]:
    """`chunks` (see :class:`~polyprof.formats.common.chunk.Chunk`) into the scratch files; a restarted
    chunk after others raises _ReadAgain (the files are then written again from it)."""
    facts = _Facts()
    last: Trace | None = None
    with pq.ParquetWriter(os.path.join(scratch, "rows.parquet"), SCRATCH) as rows, \
            pq.ParquetWriter(os.path.join(scratch, "counters.parquet"), _COUNTER_SCRATCH) as counters, \
            ThreadPoolExecutor(1) as writer:
        written: Future | None = None  # a chunk's write (GIL released) while the next one is read
        recorded: tuple[int, int] | None = None  # the window the file records (the last chunk's say)
        for chunk in chunks:
            if chunk.restarted and last is not None:
                if written is not None:
                    written.result()
                raise _ReadAgain(replace(chunk, restarted=False))
            last, recorded = chunk.trace, chunk.window
            tables = _chunk_rows(chunk.trace, facts, chunk.rows), _chunk_counters(chunk.trace, facts)
            if written is not None:
                written.result()
            written = writer.submit(lambda t=tables: (rows.write_table(t[0]), counters.write_table(t[1])))
        if written is not None:
            written.result()
    assert last is not None, "a file is read as one chunk at least"
    # the last chunk knows what the whole file says of itself: its keys, devices and threads
    head = replace(last, activities=ActivityBuilder().freeze(), counters=Counters(),
                   window=recorded or facts.window or (0, 0))
    return facts, head


def _chunk_rows(trace: Trace, facts: _Facts, keys: np.ndarray | None) -> pa.Table:
    acts = trace.activities
    n, first = len(acts), facts.rows
    facts.rows += n
    if keys is None:
        keys = np.arange(first, first + n, dtype=np.int64)
    if n:
        lo, hi = int(acts["start"].min()), int(acts["end"].max())
        facts.window = (min(lo, facts.window[0]), max(hi, facts.window[1])) if facts.window else (lo, hi)
    kind = acts["kind"]
    for number, row in step_rows(trace).items():  # the longest span of each number, the first of equals
        start, end = int(acts["start"][row]), int(acts["end"][row])
        if number not in facts.steps or end - start > facts.steps[number][0]:
            facts.steps[number] = (end - start, start, end, int(keys[row]))
            facts.step_resource[int(keys[row])] = int(acts["resource"][row])
    threads, counts = np.unique(acts["resource"][kind == int(ActivityKind.CPU_OP)], return_counts=True)
    for thread, count in zip(threads.tolist(), counts.tolist(), strict=True):
        facts.ops[thread] = facts.ops.get(thread, 0) + count
    args = args_columns(acts.args, n)
    facts.collectives += rt.collective_rows(trace, args.collective)
    return pa.table({
        "row": keys,
        "kind": kind.astype(np.int8),
        "device": acts["device"].astype(np.int32),
        "resource": acts["resource"].astype(np.int32),
        "start": acts["start"],
        "end": acts["end"],
        **rt.row_columns(trace, args),
        "skip": rt.not_nested(trace),
        "on_device": rt.on_device(kind),
    }, schema=SCRATCH)


_COUNTER_SCRATCH = pa.schema([("row", pa.int64()), ("name", pa.string()), ("device", pa.string()),
                              ("resource", pa.int64()), ("ts", pa.int64()), ("value", pa.float64())])


def _chunk_counters(trace: Trace, facts: _Facts) -> pa.Table:
    table = rt.counters_table(trace, rt.steps_by_start(*(np.zeros(0, np.int64),) * 4), 0)
    first, facts.counters = facts.counters, facts.counters + table.num_rows
    return pa.table({"row": np.arange(first, facts.counters, dtype=np.int64), "name": table["name"].cast(pa.string()),
                     "device": table["device"].cast(pa.string()), "resource": table["resource"],
                     "ts": table["ts_ns"], "value": table["value"]}, schema=_COUNTER_SCRATCH)


def _steps(facts: _Facts) -> tuple:
    numbers = sorted(facts.steps)
    spans = [facts.steps[n] for n in numbers]
    return rt.steps_by_start(np.array(numbers, dtype=np.int64), np.array([s[1] for s in spans], dtype=np.int64),
                             np.array([s[2] for s in spans], dtype=np.int64),
                             np.array([s[3] for s in spans], dtype=np.int64))


def _training_thread(facts: _Facts, steps: tuple) -> int:
    if len(steps[3]):
        return facts.step_resource[int(steps[3][0])]
    threads = np.array(sorted(facts.ops), dtype=np.int64)
    return rt.busiest(threads, np.array([facts.ops[t] for t in threads.tolist()], dtype=np.int64))


def _engine(scratch: str, memory_mb: int) -> Any:
    import duckdb

    con = duckdb.connect()
    spill = os.path.join(scratch, "engine").replace("'", "''")
    con.execute(f"set memory_limit = '{int(memory_mb)}MB'; set temp_directory = '{spill}'; set threads = 1; "
                "set enable_progress_bar = false")  # the store's bar is polyprof's
    return con


def _parquet(path: str) -> str:
    return "read_parquet('" + path.replace("'", "''") + "')"


def _write_activities(scratch: str, out: str, rank: int, head: Trace, facts: _Facts, steps: tuple, shift: int,
                      memory_mb: int) -> int:
    rows, levels = os.path.join(scratch, "rows.parquet"), os.path.join(scratch, "levels.parquet")
    con = _engine(scratch, memory_mb)
    try:
        by_thread = con.sql(f'select row, resource, start, "end", skip from {_parquet(rows)} '
                                'order by resource, start, "end" desc, row')
        with pq.ParquetWriter(levels, pa.schema([("row", pa.int64()), ("own_step", pa.int64()),
                                                 ("level", pa.int32())])) as writer:
            stack: tuple[int, np.ndarray] | None = None
            for batch in by_thread.to_arrow_reader(ENGINE_BATCH_ROWS):
                level, stack = _batch_levels(batch, stack)
                start = batch.column("start").to_numpy()
                writer.write_table(pa.table({"row": batch.column("row"), "own_step": rt.step_at(steps, start),
                                             "level": level}))
        ordered = con.sql(f"""
            with own as (select * from {_parquet(rows)} as r join {_parquet(levels)} as l using (row)),
            launch as (select correlation, arg_max(own_step, row) as launch_step from own
                       where not on_device and correlation <> 0 group by correlation)
            select own.*, case when on_device and own.correlation <> 0 then coalesce(launch_step, own_step)
                               else own_step end as step
            from own left join launch on own.correlation = launch.correlation
            order by step, start, "end" desc, row""")
        return _write_sorted(ordered.to_arrow_reader(ROW_GROUP_ROWS), out, rank, head, facts, steps, shift)
    finally:
        con.close()


def _batch_levels(batch: pa.RecordBatch, stack: tuple[int, np.ndarray] | None) -> tuple[np.ndarray, Any]:
    """The levels of a batch of rows sorted by (thread, start, longest first), the stack of the batch
    before carried in (as rows that open before any row), and the stack this batch leaves."""
    resource = batch.column("resource").to_numpy().astype(np.int64)
    start = batch.column("start").to_numpy()
    end = batch.column("end").to_numpy()
    skip = batch.column("skip").to_numpy(zero_copy_only=False)
    carried = stack[1] if stack is not None and len(resource) and stack[0] == resource[0] else np.zeros(0, np.int64)
    k = len(carried)
    resource = np.concatenate([np.full(k, resource[0] if len(resource) else 0, np.int64), resource])
    start = np.concatenate([np.full(k, _MIN, np.int64), start])
    end = np.concatenate([carried, end])
    skip = np.concatenate([np.zeros(k, dtype=bool), skip])
    level = rt.sorted_levels(resource, start, end, skip, np.arange(len(start), dtype=np.int64))
    if not len(resource):
        return level, stack
    last = np.flatnonzero((resource == resource[-1]) & ~skip)
    if not len(last):
        return level[k:], (int(resource[-1]), np.zeros(0, np.int64))
    levels = level[last]
    top = int(levels[-1])  # the stack after the last push: at each depth, the last row pushed there
    ends = np.array([end[last[np.flatnonzero(levels == d)[-1]]] for d in range(top + 1)], dtype=np.int64)
    return level[k:], (int(resource[-1]), ends)


def _write_sorted(batches: Any, out: str, rank: int, head: Trace, facts: _Facts, steps: tuple, shift: int) -> int:
    """The rows, sorted by step, into the rank's activities file as its row groups."""
    places = rt.RankPlaces.of(head, _training_thread(facts, steps), shift)
    written = 0
    with rank_file(out, "activities", rank) as path, pq.ParquetWriter(path, ACTIVITIES, compression="zstd") as w:
        for b in batches:
            placed = places.columns(*(b.column(c).to_numpy() for c in ("kind", "device", "resource", "start", "end")))
            w.write_table(pa.table({"step": b.column("step"), **placed, "level": b.column("level"),
                                    **{c: b.column(c) for c in rt.ROW_COLUMNS}}, schema=ACTIVITIES),
                          row_group_size=ROW_GROUP_ROWS)
            written += b.num_rows
    return written


def _write_counters(scratch: str, out: str, rank: int, steps: tuple, shift: int) -> int:
    written = 0
    source = pq.ParquetFile(os.path.join(scratch, "counters.parquet"))
    with rank_file(out, "counters", rank) as path, pq.ParquetWriter(path, COUNTERS, compression="zstd") as w:
        for b in source.iter_batches(ROW_GROUP_ROWS):
            ts = b.column("ts").to_numpy()
            w.write_table(pa.table({"name": b.column("name"), "device": b.column("device"),
                                    "resource": b.column("resource"), "ts_ns": ts + shift,
                                    "value": b.column("value"), "step": rt.step_at(steps, ts)}).cast(COUNTERS),
                          row_group_size=ROW_GROUP_ROWS)
            written += b.num_rows
    return written
