"""Chrome trace JSON in Kineto's dialect (what torch.profiler writes), so Perfetto, Holistic Trace
Analysis, TensorBoard's plugin and existing scripts read polyprof traces unchanged.

::

    from polyprof.formats.chrome.write import write_chrome_trace
    write_chrome_trace(trace, "trace.json")        # or "trace.json.gz": gzip written directly

Layout: ``schemaVersion``, ``deviceProperties``, metadata keys, ``displayTimeUnit``,
``baseTimeNanoseconds``, ``traceEvents``, ``traceName``. ``ts``/``dur`` are microseconds with three
nanosecond decimals, relative to ``baseTimeNanoseconds``. Flows are ``s``/``f`` pairs named ``ac2g``
(host launch -> device work) or ``fwdbwd``; the ``f`` end carries ``"bp": "e"``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import orjson

from polyprof import _native
from polyprof._native.shared import FLAG_CORRELATION, FLAG_FLOW_START, FLAG_INSTANT
from polyprof.formats.common.jsonsafe import json_bytes, json_text
from polyprof.formats.common.paths import check_output_path, trace_output
from polyprof.model import ActivityKind, Args, Trace
from polyprof.model.args import is_json_column

CHUNK_ROWS = 65_536
ENVELOPE_NAME = "PyTorch Profiler"  # Kineto's name for the profiler span (tools look for it)
RESERVED_KEYS = {
    "schemaVersion",
    "deviceProperties",
    "displayTimeUnit",
    "baseTimeNanoseconds",
    "traceEvents",
    "traceName",
}

# Kinds whose correlation is their own External id, so Kineto writes no separate "correlation" arg.
_NO_CORRELATION_LIST = [
    int(ActivityKind.CPU_OP),
    int(ActivityKind.USER_ANNOTATION),
    int(ActivityKind.PYTHON_FUNCTION),
    int(ActivityKind.INSTANT),
]


_WRITES_CORRELATION = np.ones(256, dtype=bool)  # by kind: whether a row's correlation is written
_WRITES_CORRELATION[_NO_CORRELATION_LIST] = False


def _json(value: Any) -> str:
    return json_text(value)


def _metadata_json(value: Any) -> str:
    """A top-level value as Kineto writes it: JSON with ", " and ": " between items (HTA finds a
    trace's rank with the pattern '"rank": <n>', spacing included)."""
    return json.dumps(orjson.loads(json_bytes(value)), ensure_ascii=False)


def _us(rel_ns: int) -> str:
    rel_ns = max(0, rel_ns)
    return f"{rel_ns // 1000}.{rel_ns % 1000:03d}"


def write_chrome_trace(trace: Trace, path: str | os.PathLike, *, trace_name: str | None = None) -> str:
    """Write `trace` to `path` atomically; gzip-compressed when the name ends in ``.gz``. Returns the path."""
    path = check_output_path(path)
    with trace_output(path) as out:
        _write(trace, out, trace_name or path)
    return path


def dumps_chrome_trace(trace: Trace, trace_name: str = "") -> bytes:
    """The trace as JSON bytes (for small traces and tests)."""
    import io

    buf = io.BytesIO()
    _write(trace, buf, trace_name)
    return buf.getvalue()


def trace_metadata(trace: Trace) -> dict[str, Any]:
    """The trace's top-level keys as written: its metadata, with the backends' statuses and the phase
    timings serialised into ``polyprof`` (their one owner is the status objects on the trace)."""
    meta = dict(trace.metadata)
    own = meta.get("polyprof")
    own = dict(own) if isinstance(own, dict) else ({} if own is None else {"value": own})
    if trace.backends:
        own["backends"] = {name: st.to_json() for name, st in trace.backends.items()}
        timings: dict[str, Any] = {name: dict(st.timings_ms) for name, st in trace.backends.items() if st.timings_ms}
        timings.update({k: v for k, v in trace.timings_ms.items() if k != "write"})
        if timings:
            own["postprocess_ms"] = timings
    if own:
        meta["polyprof"] = own
    return meta


def _write(trace: Trace, out: IO[bytes], trace_name: str) -> None:
    head = ['{\n  "schemaVersion": 1,\n  "deviceProperties": ', _metadata_json(device_properties(trace))]
    for key, value in trace_metadata(trace).items():
        if key not in RESERVED_KEYS:
            head.append(f",\n  {_json(str(key))}: {_metadata_json(value)}")
    head.append(
        f',\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {int(trace.base_time_ns)},\n  "traceEvents": [\n'
    )
    out.write("".join(head).encode())
    first = True
    for chunk in iter_event_chunks(trace):
        if not chunk:
            continue
        if not first:
            out.write(b",\n")
        out.write(chunk)
        first = False
    out.write(f'\n  ],\n  "traceName": {_json(trace_name)}\n}}\n'.encode())


def device_properties(trace: Trace) -> list[dict[str, Any]]:
    """Explicit `deviceProperties` entries, plus one per device that declared properties."""
    props = [dict(p) for p in trace.device_properties if isinstance(p, dict)]
    covered = {repr((p.get("id"), p.get("name"))) for p in props}  # repr: ids of any type, hashable or not
    for d in trace.devices:
        if d.properties and repr((d.index, d.name)) not in covered:
            props.append({"id": d.index, "name": d.name, "type": d.type, **d.properties})
    return props


def iter_event_chunks(trace: Trace) -> Iterator[bytes]:
    """The `traceEvents` entries as UTF-8 JSON (events separated by ",\n"), in chunks of at most
    CHUNK_ROWS activities; a chunk may be empty."""
    offset = trace.epoch_offset_ns - trace.base_time_ns
    pids = np.array([d.pid for d in trace.devices], dtype=np.int64)
    tids = np.array([r.id for r in trace.resources] or [0], dtype=np.int64)
    acts = trace.activities
    n = len(acts)
    if n:
        names = [json_bytes(s) for s in acts.strings.strings]
        arg_rows = acts.args.rows()
        dicts = acts.args.dicts  # rows with dict args, sorted once for the column-block pass
        dict_rows = np.sort(np.fromiter(dicts, dtype=np.int64, count=len(dicts)))

        def within(rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
            return rows[np.searchsorted(rows, lo) : np.searchsorted(rows, hi)]

        for lo in range(0, n, CHUNK_ROWS):
            hi = min(n, lo + CHUNK_ROWS)
            yield _activity_chunk(
                acts, lo, hi, within(arg_rows, lo, hi), within(dict_rows, lo, hi), offset, names, pids, tids
            )
    yield ",\n".join(_counter_events(trace, offset, pids, tids)).encode()
    yield ",\n".join(_metadata_events(trace, offset)).encode()




def _activity_chunk(
    acts: Any,
    lo: int,
    hi: int,
    arg_rows: np.ndarray,
    dict_rows: np.ndarray,
    offset: int,
    names: list[bytes],
    pids: np.ndarray,
    tids: np.ndarray,
) -> bytes:
    """UTF-8 JSON of rows lo..hi (events separated by ",\n"), by the C formatter when built.
    `arg_rows` are the rows in lo..hi that have args, `dict_rows` those of them with dict args."""
    c = {k: v[lo:hi] for k, v in acts.columns.items()}
    kind = c["kind"]
    flags = np.where((c["correlation"] != 0) & _WRITES_CORRELATION[kind], FLAG_CORRELATION, 0)
    flags |= np.where(kind == int(ActivityKind.INSTANT), FLAG_INSTANT, 0)
    flags |= np.where(c["flow_start"] != 0, FLAG_FLOW_START, 0)
    flags = flags.astype(np.int8)
    # the columns as stored (no widening); ts = start + offset and dur = end - start are the formatter's
    cols = (
        c["cat"],
        c["name"],
        pids[c["device"]],
        tids[c["resource"]],
        c["start"],
        c["end"],
        c["external_id"],
        c["correlation"],
        c["flow_id"],
        c["flow_type"],
        flags,
    )
    extra: list[Any] = [None] * (hi - lo)
    if len(arg_rows):
        pending = arg_rows
        if acts.args.blocks:
            pending = _format_block_args(
                acts.args, lo, hi, arg_rows, dict_rows, cols[6], cols[7], flags, extra
            )
        local = pending - lo
        ext_l, corr_l = cols[6][local].tolist(), cols[7][local].tolist()
        with_corr = (flags[local] & FLAG_CORRELATION).tolist()
        for i, row, e, corr, wc in zip(
            local.tolist(), pending.tolist(), ext_l, corr_l, with_corr, strict=True
        ):
            a = acts.args[row]
            head = {}
            if e:
                head["External id"] = e
            if wc and "correlation" not in a:
                head["correlation"] = corr
            extra[i] = json_bytes({**head, **a} if head else a)
    return _native.format_activities(cols, offset, names, extra)


def _format_block_args(
    args: Args,
    lo: int,
    hi: int,
    arg_rows: np.ndarray,
    dict_rows: np.ndarray,
    ext: np.ndarray,
    corr: np.ndarray,
    flags: np.ndarray,
    extra: list[Any],
) -> np.ndarray:
    """Fill `extra` for the rows of lo..hi whose args come from exactly one column block, column-wise
    (``_native.format_arg_objects``); returns the rows left for the per-row path (dict args, or several
    sources to merge)."""
    sources = np.zeros(hi - lo, dtype=np.int64)
    spans = []
    for b in args.blocks:
        p0, p1 = np.searchsorted(b.rows, lo), np.searchsorted(b.rows, hi)
        if p1 > p0:
            spans.append((b, p0, p1))
            sources[b.rows[p0:p1] - lo] += 1
    sources[dict_rows - lo] += 2
    for b, p0, p1 in spans:
        local = b.rows[p0:p1] - lo
        alone = sources[local] == 1
        if not alone.any():
            continue
        positions = np.arange(p0, p1)[alone]
        local = local[alone]
        with_corr = (flags[local] & FLAG_CORRELATION) != 0
        head_corr = (
            np.zeros(len(local), dtype=np.int64)
            if "correlation" in b.keys
            else np.where(with_corr, corr[local], 0)
        )
        objects = _native.format_arg_objects(
            np.ascontiguousarray(ext[local]),
            np.ascontiguousarray(head_corr, dtype=np.int64),
            [json_bytes(k) for k in b.keys],
            [c_arg_column(c[positions]) for c in b.columns],
        )
        for i, obj in zip(local.tolist(), objects, strict=True):
            extra[i] = obj
    return arg_rows[sources[arg_rows - lo] != 1]


def c_arg_column(values: np.ndarray) -> Any:
    """An arg column as format_arg_objects takes it: int64 or float64 array, else JSON bytes per value."""
    if is_json_column(values):
        return values.tolist()
    kind = values.dtype.kind
    if kind == "i" or (kind == "u" and (len(values) == 0 or int(values.max()) < 2**63)):
        return np.ascontiguousarray(values, dtype=np.int64)
    if kind == "f":
        return np.ascontiguousarray(values, dtype=np.float64)
    items = values.tolist()
    try:  # values repeat (grids, blocks, names): encode each distinct one once
        # keyed by type too: 1, 1.0 and True are equal as dict keys but not as JSON
        keys = [(type(v), v) for v in items]
        encoded = {k: json_bytes(k[1]) for k in set(keys)}
        return [encoded[k] for k in keys]
    except TypeError:  # unhashable values such as lists
        return [json_bytes(v) for v in items]


def _counter_events(trace: Trace, offset: int, pids: np.ndarray, tids: np.ndarray) -> Iterator[str]:
    for s in trace.counters.samples:
        tid = f',"tid":{int(tids[s.resource])}' if s.resource >= 0 else ""
        yield (
            f'{{"ph":"C","name":{_json(s.name)},"pid":{int(pids[s.device])}{tid},"ts":{_us(s.ts + offset)},'
            f'"args":{{{_json(s.name)}:{_json(s.value)}}}}}'
        )


def _metadata_events(trace: Trace, offset: int) -> Iterator[str]:
    ts = _us(trace.window[0] + offset)

    def row(kind: str, pid: int, tid: int, args: dict) -> str:
        return f'{{"name":"{kind}","ph":"M","ts":{ts},"pid":{pid},"tid":{tid},"args":{_json(args)}}}'

    for d in trace.devices:
        yield row("process_name", d.pid, 0, {"name": d.name})
        if d.label:
            yield row("process_labels", d.pid, 0, {"labels": d.label})
        yield row("process_sort_index", d.pid, 0, {"sort_index": d.sort_index})
    for r in trace.resources:
        pid = trace.devices[r.device].pid
        yield row("thread_name", pid, r.id, {"name": r.name})
        yield row("thread_sort_index", pid, r.id, {"sort_index": r.sort_index})
    # Kineto's envelope: the profiler span, its iteration marker, the end of the window (tools look
    # for these names; the span's cat "Trace" keeps it out of annotation counts)
    # the end marker 1 ns after the window: a reader adding ts + dur in doubles may round a span that
    # ends with the window a hair past it
    start, end = _us(trace.window[0] + offset), _us(trace.window[1] + offset + 1)
    dur = _us(trace.window[1] - trace.window[0])
    yield (
        f'{{"ph":"X","cat":"Trace","name":"{ENVELOPE_NAME} (0)","pid":"Spans","tid":"{ENVELOPE_NAME}",'
        f'"ts":{start},"dur":{dur},"args":{{"Op count":0}}}}'
    )
    yield f'{{"name":"process_sort_index","ph":"M","ts":{start},"pid":"Spans","tid":0,"args":{{"sort_index":536870912}}}}'
    yield (
        f'{{"ph":"i","s":"g","name":"Iteration Start: {ENVELOPE_NAME}","pid":"Traces",'
        f'"tid":"Trace {ENVELOPE_NAME}","ts":{start}}}'
    )
    yield f'{{"ph":"i","s":"g","name":"Record Window End","pid":"","tid":"","ts":{end}}}'
