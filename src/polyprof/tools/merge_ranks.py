"""``polyprof merge``: one timeline from many ranks' traces (polyprof's and torch.profiler's alike).

::

    from polyprof.tools.merge_ranks import merge_traces
    merge_traces(["traces/rank0.json.gz", "traces/rank1.json.gz"], "job.pftrace")   # or a folder

Each rank becomes its own processes, named ``rank R · host · <device>``, ordered rank by rank; process
ids, flow ids, correlation and External ids are made unique per rank; times are put on rank 0's clock
with the offset each polyprof trace recorded (the torch backend's clock ``to rank 0``); traces without
one (torch.profiler's) are merged on their own epoch, which the merged trace says. Every rank's
top-level metadata is kept under ``ranks``. JSON to JSON streams: each event's pid, times and ids are
rewritten byte by byte as the file is read, the rest copied (``_native/csrc/merge_events.c``; its pure-Python
twin reads with ijson), so memory stays flat whatever the sizes. polyprof's own .pftrace ranks into a
.pftrace stream too: each packet's sequence, time, tracks, pids and ids rewritten field by field
(``_native/csrc/merge_packets.c``), after a first walk that checks every field is one it knows. Otherwise
(another writer's .pftrace, JSON into .pftrace, .pftrace into JSON, or no C extension) the ranks are
read into the model and written one at a time: memory is about one rank's trace, never the sum of them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import orjson

from polyprof.errors import ConfigError, TraceFormatError
from polyprof.formats.chrome.write import trace_metadata
from polyprof.formats.common.job import rank_of, recorded_offset, trace_files
from polyprof.formats.common.jsonsafe import json_bytes
from polyprof.formats.common.paths import check_output_path, format_of, trace_output
from polyprof.formats.common.streaming import BackgroundWriter, feed
from polyprof.model import ActivityTable, Args, Counters, Trace
from polyprof.model.args import ArgsBlock, JSONArray, is_json_column
from polyprof.plugin.clock import base_time_ns

ID_STRIDE = 1 << 40  # ids of rank r are shifted by r * ID_STRIDE: unique across ranks, within int64
PID_STRIDE = 1000


@dataclass
class RankInput:
    path: str
    rank: int
    host: str
    offset_ns: int | None  # to rank 0's clock; None: not recorded
    uncertainty_ns: int | None


@dataclass
class MergeStats:
    ranks: list[RankInput] = field(default_factory=list)
    events: int = 0
    output: str = ""


_WHOLE_READS = threading.Lock()


def _describe(path: str, position: int) -> tuple[RankInput, Trace, bool]:
    """A .pftrace rank's place and clock, as a trace without its events, and whether its packets can
    be rewritten as they are (polyprof's own trace, every field one merge_packets.c knows): then from a
    walk over its packets that keeps all but the events, else from the whole trace read."""
    from polyprof import _native
    from polyprof.formats.common.source import max_trace_bytes, read_bytes
    from polyprof.formats.files import parse_trace
    from polyprof.formats.perfetto.scan import scan_perfetto

    rewriter = _native.packet_rewriter(0, 0, 0, 0, 0, b"", 1)
    if rewriter is not None:  # (None: declined, without the extension)
        kept: list[bytes] = []
        try:
            _walk_packets(path, rewriter, kept.append, skeleton=True)
        except ValueError:  # not a trace the rewriter takes as it is: read the whole of it
            kept = []
        trace = scan_perfetto(b"".join(kept), path, metadata_only=True) if kept else None
        if trace is not None:
            return _rank_input(trace, path, position), trace, True
    with _WHOLE_READS:  # first passes run side by side: one whole rank in memory at a time all the same
        data = read_bytes(path, max_trace_bytes())
        trace = scan_perfetto(data, path, metadata_only=True) or parse_trace(data, path)
        del data
    return _rank_input(trace, path, position), trace, False


def _rank_input(trace: Trace, path: str, position: int) -> RankInput:
    offset, uncertainty = recorded_offset(trace)
    host = str(trace.metadata.get("host_name") or (trace.metadata.get("polyprof") or {}).get("host") or "")
    return RankInput(path, rank_of(trace, position), host, offset, uncertainty)


def _placed(trace: Trace, rank: RankInput, base: int) -> Trace:
    """`trace` as rank `rank.rank` of the merged timeline (see the module docstring)."""
    r = rank.rank
    devices = [
        dataclasses.replace(
            d, key=f"rank{r}/{d.key}", pid=(r + 1) * PID_STRIDE + i, sort_index=r * PID_STRIDE + i,
            name=" · ".join(x for x in (f"rank {r}", rank.host, d.label or d.name) if x),
        )
        for i, d in enumerate(trace.devices)
    ]
    acts = trace.activities
    cols = dict(acts.columns)
    for name in ("flow_id", "correlation", "external_id"):
        column = cols[name].astype(np.int64)
        cols[name] = np.where(column != 0, column + r * ID_STRIDE, 0)
    args = _ids_shifted(acts.args, r * ID_STRIDE)
    # every rank's times onto one timeline: ns since `base` on rank 0's epoch (the rank's own host clock
    # is unrelated to another host's)
    delta = trace.epoch_offset_ns + (rank.offset_ns or 0) - base
    cols["start"], cols["end"] = cols["start"] + delta, cols["end"] + delta
    counters = trace.counters.columns
    shifted = Counters.from_columns(trace.counters.strings, {**counters, "ts": counters["ts"] + delta})
    return dataclasses.replace(
        trace,
        activities=ActivityTable(acts.strings, cols, args),
        devices=devices,
        counters=shifted,
        epoch_offset_ns=base,
        base_time_ns=base,
        window=(trace.window[0] + delta, trace.window[1] + delta),
    )


def _ids_shifted(args: Args, shift: int) -> Args:
    """`args` with their "correlation" (kept among a row's args when read back, and written from them)
    shifted by `shift` where it is a non-zero integer, as the JSON merge shifts it."""
    key = "correlation"

    def shifted(value: Any) -> Any:
        return value + shift if isinstance(value, int) and not isinstance(value, bool) and value else value

    dicts = {row: {**a, key: shifted(a[key])} if key in a else a for row, a in args.dicts.items()}
    blocks = []
    for b in args.blocks:
        columns = list(b.columns)
        if key in b.keys:
            at = b.keys.index(key)
            c = columns[at]
            if is_json_column(c):
                columns[at] = _json_ids_shifted(c, shift, shifted)
            elif c.dtype.kind in "iu":
                columns[at] = np.where(c != 0, c.astype(np.int64) + shift, 0)
            elif c.dtype == object:
                columns[at] = np.array([shifted(v) for v in c.tolist()] + [None], dtype=object)[:-1]
        blocks.append(ArgsBlock(b.rows, b.keys, columns))
    return Args(dicts, blocks)


def _json_ids_shifted(column: np.ndarray, shift: int, shifted: Any) -> np.ndarray:
    """A column of JSON texts (b"": no value) with its non-zero integers shifted: numpy's parse of
    decimal text where every value is an integer (the usual case), else value by value."""
    texts = np.asarray(column, dtype=object)
    present = np.flatnonzero(np.fromiter(map(len, texts.tolist()), dtype=np.int64, count=len(texts)) > 0)
    out = texts.copy()
    try:
        values = texts[present].astype("S").astype(np.int64)
    except (ValueError, OverflowError):  # floats, strings, lists...: each read as JSON
        out[present] = [json_bytes(shifted(orjson.loads(v))) for v in texts[present].tolist()]
    else:
        out[present] = np.where(values != 0, values + shift, 0).astype("S").astype(object)
    return JSONArray.of(out.tolist(), len(out))


def ranks_done(order: list[int]) -> Iterator[int]:
    """`order`, each rank counted as done (progress) once the loop comes back for the next."""
    from polyprof import progress

    advance = progress.task("ranks merged", total=len(order))
    for i in order:
        yield i
        advance(1)


def merge_traces(paths: list[str], output: str | os.PathLike, *, format: str | None = None) -> MergeStats:
    """Merge the ranks' trace files `paths` (files or folders) into `output` (a ``.polyprof`` output is
    the trace store: :func:`polyprof.store.write_store`)."""
    if format_of(output, format) == "store":
        from polyprof.formats.store.write import write_store

        written = write_store(paths, output, overwrite=True)
        return MergeStats(output=written.path, events=written.rows.get("activities", 0),
                          ranks=[RankInput(written.sources[r], r, "", None, None) for r in written.ranks])
    files = trace_files([os.fspath(p) for p in paths])
    output = check_output_path(output)
    if output in {os.path.abspath(f) for f in files}:
        raise ConfigError(f"polyprof merge: the output {output} is one of the inputs; give another name")
    stats = MergeStats(output=output)
    from polyprof.formats.perfetto.read import is_perfetto_file

    if format_of(output, format) == "json" and not any(is_perfetto_file(f) for f in files):
        described = [_json_rank(f, position) for position, f in enumerate(files)]
        stats.ranks = [d[0] for d in described]
        _unique_ranks(stats)
        base = base_time_ns(min(b + min(r.offset_ns or 0, 0) for r, b, _ in described))
        with trace_output(output) as out:
            _stream_json(out, files, stats, [b for _, b, _ in described], [t for _, _, t in described], base)
        return stats
    # a first pass for the ranks, their clocks and the base time (the C walks of several .pftrace ranks
    # run side by side: they do not hold the GIL)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(files), os.cpu_count() or 1, 4))) as pool:
        places = list(pool.map(_place_of, files, range(len(files))))
    stats.ranks = [rank for rank, _, _ in places]
    starts = [start for _, start, _ in places]
    as_they_are = [described for _, _, described in places]  # a rank's trace without events: its packets rewritten
    _unique_ranks(stats)
    base = base_time_ns(min(starts))
    order = sorted(range(len(files)), key=lambda i: stats.ranks[i].rank)
    with trace_output(output) as out:
        if format_of(output, format) == "perfetto":
            _write_perfetto(out, files, stats, order, base, min(starts) - base, as_they_are)
        else:
            _write_json(out, files, stats, order, base)
    return stats


def _place_of(path: str, position: int) -> tuple[RankInput, int, Trace | None]:
    """A rank's place, the start of its window on its epoch and rank 0's clock, and (where its packets
    can be rewritten as they are) its trace without events."""
    from polyprof.formats.perfetto.read import is_perfetto_file

    if is_perfetto_file(path):
        rank, trace, rewritable = _describe(path, position)
        return rank, trace.window[0] + trace.epoch_offset_ns + (rank.offset_ns or 0), trace if rewritable else None
    rank, base_ns, _ = _json_rank(path, position)  # a JSON rank says all that in its top-level keys
    return rank, base_ns + (rank.offset_ns or 0), None


def _unique_ranks(stats: MergeStats) -> None:
    seen = [r.rank for r in stats.ranks]
    if len(set(seen)) != len(seen):  # traces that do not say their rank (or say the same): file order
        for position, r in enumerate(stats.ranks):
            r.rank = position


def _rank_metadata(rank: RankInput, metadata: dict[str, Any]) -> dict[str, Any]:
    """What the merged trace keeps of a rank: its place, its clock, its top-level metadata."""
    return {"rank": rank.rank, "host": rank.host, "file": rank.path, "clock_offset_ns": rank.offset_ns,
            "clock_uncertainty_ns": rank.uncertainty_ns,
            "clock": "shifted onto rank 0's by the recorded offset" if rank.offset_ns is not None
            else "its own epoch (no offset recorded: merged as written)",
            "metadata": metadata}


def _json_head(out: IO[bytes], base: int) -> None:
    out.write(b'{\n  "schemaVersion": 1,\n  "displayTimeUnit": "ms",\n')
    out.write(b'  "baseTimeNanoseconds": %d,\n  "traceEvents": [\n' % base)


def _json_tail(out: IO[bytes], ranks: list[dict[str, Any]]) -> None:
    """After the events: every rank's place and metadata, and the merged trace's name."""
    out.write(b'\n  ],\n  "ranks": ' + json_bytes(ranks) + b',\n  "traceName": "polyprof merge"\n}\n')


def _write_json(out: IO[bytes], files: list[str], stats: MergeStats, order: list[int], base: int) -> None:
    from polyprof.formats import load_trace
    from polyprof.formats.chrome.write import iter_event_chunks

    _json_head(out, base)
    first, ranks = True, []
    for i in ranks_done(order):
        rank = stats.ranks[i]
        trace = _placed(load_trace(files[i]), rank, base)
        for chunk in iter_event_chunks(trace):
            if chunk:
                out.write(chunk if first else b",\n" + chunk)
                first = False
        stats.events += len(trace.activities)
        ranks.append(_rank_metadata(rank, trace_metadata(trace)))
        del trace
    _json_tail(out, ranks)


def _write_perfetto(
    out: IO[bytes], files: list[str], stats: MergeStats, order: list[int], base: int, t0: int,
    as_they_are: list[Trace | None],
) -> None:
    """One clock snapshot, then each rank on packet sequences of its own: its packets rewritten where
    they can be (`as_they_are`), else its trace read into the model and written."""
    from polyprof.formats import load_trace
    from polyprof.formats.perfetto.write import (
        clock_packet,
        iter_perfetto_chunks,
        metadata_values,
        standalone_metadata,
    )

    sequence = 1
    with BackgroundWriter(out, b"") as sink:
        sink.write(clock_packet(t0, base, sequence))
        for i in ranks_done(order):
            rank, described = stats.ranks[i], as_they_are[i]
            sequence += 1
            if described is not None:
                shift = described.epoch_offset_ns + (rank.offset_ns or 0) - base
                events, sequences = _rewrite_rank_packets(files[i], rank, shift, sequence, sink.write)
                sequence += sequences
                meta = {"rank": _rank_metadata(rank, trace_metadata(described))}
                values = metadata_values(dataclasses.replace(described, metadata=meta, base_time_ns=base))
                sink.write(standalone_metadata(values, described.window[0] + shift, sequence))
                stats.events += events
                continue
            trace = _placed(load_trace(files[i]), rank, base)
            trace.metadata = {"rank": _rank_metadata(rank, trace_metadata(trace))}
            for chunk in iter_perfetto_chunks(trace, sequence_id=sequence, stable_tracks=True, clock=False, layout=False):
                sink.write(chunk)
            stats.events += len(trace.activities)
            del trace


def _rewrite_rank_packets(path: str, rank: RankInput, shift_ns: int, first_sequence: int, emit: Any) -> tuple[int, int]:
    """The rank's packets rewritten onto the merged timeline (merge_packets.c); (events, sequences used)."""
    from polyprof import _native

    r = rank.rank
    prefix = " · ".join(x for x in (f"rank {r}", rank.host) if x).encode()
    rewriter = _native.packet_rewriter(shift_ns, r * ID_STRIDE, r, (r + 1) * PID_STRIDE, r * PID_STRIDE, prefix, first_sequence)
    try:
        return _walk_packets(path, rewriter, emit, skeleton=False)
    except ValueError as exc:  # the first walk took it: the file changed since
        raise TraceFormatError(f"{path}: {exc}") from None


def _walk_packets(path: str, rewriter: Any, emit: Any, *, skeleton: bool) -> tuple[int, int]:
    """One walk of a .pftrace's packets through `rewriter`, its output to `emit`: (events, sequences)."""
    from polyprof import _native

    counts = (0, 0)

    def step(data: memoryview, final: bool) -> tuple[int, bool]:
        nonlocal counts
        out, used, *got = _native.rewrite_packets(rewriter, data, final, skeleton)
        counts = (got[0], got[1])
        emit(out)
        return used, False

    feed(path, step)
    return counts


# -- JSON to JSON, streaming: each event rewritten as it is read (pid, times, ids), nothing held ------
_PROCESS_ROWS = ("process_name", "process_labels", "process_sort_index")


def _json_rank(path: str, position: int) -> tuple[RankInput, int, dict[str, Any]]:
    """A JSON rank's place from its top-level keys alone (head and tail of the file)."""
    from polyprof.tools.convert import top_level_keys

    top = top_level_keys(path)
    info = top.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else position
    offset = uncertainty = None
    backends = (top.get("polyprof") or {}).get("backends") if isinstance(top.get("polyprof"), dict) else None
    for status in (backends or {}).values():
        sync = (status.get("clock") or {}).get("to rank 0") if isinstance(status, dict) else None
        if isinstance(sync, dict) and isinstance(sync.get("offset_ns"), int):
            offset, uncertainty = sync["offset_ns"], sync.get("uncertainty_ns")
    base = top.get("baseTimeNanoseconds", 0)
    return RankInput(path, rank, str(top.get("host_name") or ""), offset, uncertainty), base if isinstance(base, int) else 0, top


def _stream_json(out: IO[bytes], files: list[str], stats: MergeStats, bases: list[int], tops: list[dict], base: int) -> None:
    _json_head(out, base)
    ranks = []
    with BackgroundWriter(out) as events:
        for i in ranks_done(sorted(range(len(files)), key=lambda k: stats.ranks[k].rank)):
            rank = stats.ranks[i]
            r = rank.rank
            pids: dict[Any, int] = {}
            rows: list[tuple[Any, str, Any]] = []
            shift_ns = bases[i] + (rank.offset_ns or 0) - base
            args = (files[i], events.write, shift_ns, r * ID_STRIDE, (r + 1) * PID_STRIDE, pids, rows)
            rewritten = _rank_events_c(*args)
            stats.events += _rank_events_py(*args) if rewritten is None else rewritten
            events.write(_process_rows(rank, pids, rows))
            top = {k: v for k, v in tops[i].items() if k not in ("traceEvents", "schemaVersion", "displayTimeUnit", "traceName")}
            ranks.append(_rank_metadata(rank, top))
    _json_tail(out, ranks)


def _process_rows(rank: RankInput, pids: dict[Any, int], rows: list[tuple[Any, str, Any]]) -> bytes:
    """The rank's processes under their merged pids, named ``rank R · host · <its name or label>``."""
    import orjson

    processes: dict[Any, dict[str, Any]] = {}
    for key, name, args in rows:
        value = (orjson.loads(args) if args else {}) if isinstance(args, bytes) else args
        processes.setdefault(key, {})[name] = value if isinstance(value, dict) else {}
    r, out = rank.rank, []
    for key, new in pids.items():
        fields = processes.get(key, {})
        old = orjson.loads(key) if isinstance(key, bytes) else key
        name = str((fields.get("process_name") or {}).get("name", f"process {old}"))
        label = str((fields.get("process_labels") or {}).get("labels", ""))
        full = " · ".join(x for x in (f"rank {r}", rank.host, label or name) if x)
        out.append({"name": "process_name", "ph": "M", "ts": 0, "pid": new, "tid": 0, "args": {"name": full}})
        if label:
            out.append({"name": "process_labels", "ph": "M", "ts": 0, "pid": new, "tid": 0, "args": {"labels": label}})
        sort = r * PID_STRIDE + (new - (r + 1) * PID_STRIDE)
        out.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": new, "tid": 0, "args": {"sort_index": sort}})
    return b"".join(b",\n" + orjson.dumps(row) for row in out)


def _rank_events_c(path: str, emit: Any, shift_ns: int, id_shift: int, pid_base: int, pids: dict, rows: list) -> int | None:
    """One rank's events rewritten by the C scanner (merge_events.c) as the file streams in; the
    number of X/i/I events, or None where it declined (before anything was emitted)."""
    from polyprof import _native

    events, started, declined = 0, False, False

    def step(data: memoryview, final: bool) -> tuple[int, bool]:
        nonlocal events, started, declined
        start = 0
        if not started:
            start = _native.events_array_start(data)
            if start == _native.DECLINED:
                declined = True
                return 0, True
            if start == -1:
                if final:
                    raise TraceFormatError(f"{path}: the file ends before its traceEvents list does")
                return 0, False
            if start == -3:
                raise TraceFormatError(f"{path}: not a Chrome trace JSON (an object with traceEvents, or a list of events)")
            if start == -2:
                return 0, True  # no traceEvents: nothing of this rank to merge
            started = True
        try:
            out, used, n, done = _native.rewrite_rank_events(data, start, final, shift_ns, id_shift, pid_base, pids, rows)
        except ValueError as exc:
            raise TraceFormatError(f"{path}: {exc}") from None
        emit(out)
        events += n
        return used, done

    feed(path, step)
    return None if declined else events


def _rank_events_py(path: str, emit: Any, shift_ns: int, id_shift: int, pid_base: int, pids: dict, rows: list) -> int:
    """The reference of `_rank_events_c`: ijson, event by event, the same rewrite."""
    import orjson

    from polyprof.formats.chrome.dialect import ENVELOPE_PIDS
    from polyprof.formats.chrome.read import json_events
    from polyprof.formats.common.source import open_stream
    from polyprof.formats.common.values import hashable

    buf: list[bytes] = []
    events, shift_us = 0, shift_ns / 1000.0
    with open_stream(path) as stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        for ev in json_events(stream, head.lstrip().startswith(b"[")):
            if not isinstance(ev, dict):
                continue
            ph, pid = ev.get("ph"), hashable(ev.get("pid"))
            if ev.get("cat") == "Trace" or pid in ENVELOPE_PIDS or (ph == "i" and ev.get("s") == "g"):
                continue  # each rank's Kineto envelope: the merged trace is not one profile
            if ph == "M" and ev.get("name") in _PROCESS_ROWS:
                rows.append((pid, ev["name"], ev.get("args") or {}))
                pids.setdefault(pid, pid_base + len(pids))
                continue
            if "pid" in ev:
                ev["pid"] = pids.setdefault(pid, pid_base + len(pids))
            ts = ev.get("ts")
            if isinstance(ts, (int, float)) and not isinstance(ts, bool):
                ev["ts"] = round(ts + shift_us, 3)
            if ph in ("s", "f", "t") and isinstance(ev.get("id"), int):
                ev["id"] += id_shift
            args = ev.get("args")
            if isinstance(args, dict):
                for key in ("External id", "correlation"):
                    v = args.get(key)
                    if isinstance(v, int) and not isinstance(v, bool) and v:
                        args[key] = v + id_shift
            if ph in ("X", "i", "I"):
                events += 1
            buf.append(b",\n" + orjson.dumps(ev, default=str))
            if len(buf) >= 8192:
                emit(b"".join(buf))
                buf = []
    emit(b"".join(buf))
    return events
