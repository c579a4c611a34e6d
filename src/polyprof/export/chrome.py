"""Chrome trace JSON in Kineto's dialect (what torch.profiler writes), so Perfetto, Holistic Trace
Analysis, TensorBoard's plugin and existing scripts read polyprof traces unchanged.

::

    from polyprof.export.chrome import write_chrome_trace
    write_chrome_trace(trace, "trace.json")        # or "trace.json.gz": gzip written directly

Layout: ``schemaVersion``, ``deviceProperties``, metadata keys, ``displayTimeUnit``,
``baseTimeNanoseconds``, ``traceEvents``, ``traceName``. ``ts``/``dur`` are microseconds with three
nanosecond decimals, relative to ``baseTimeNanoseconds``. Flows are ``s``/``f`` pairs named ``ac2g``
(host launch -> device work) or ``fwdbwd``; the ``f`` end carries ``"bp": "e"``.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import orjson

from polyprof.export.paths import atomic_output, check_output_path
from polyprof.model import FLOW_NAMES, ActivityKind, Trace

CHUNK_ROWS = 65_536
GZIP_LEVEL = 3  # ~2x faster than the default 9 for a few percent more bytes
RESERVED_KEYS = {
    "schemaVersion",
    "deviceProperties",
    "displayTimeUnit",
    "baseTimeNanoseconds",
    "traceEvents",
    "traceName",
}

_FRACTION = np.array([f".{i:03d}" for i in range(1000)], dtype=object)
_NO_CORRELATION_ARG = {
    int(ActivityKind.CPU_OP),
    int(ActivityKind.USER_ANNOTATION),
    int(ActivityKind.PYTHON_FUNCTION),
    int(ActivityKind.INSTANT),
}


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()


def _us(rel_ns: int) -> str:
    rel_ns = max(0, rel_ns)
    return f"{rel_ns // 1000}.{rel_ns % 1000:03d}"


def write_chrome_trace(trace: Trace, path: str | os.PathLike, *, trace_name: str | None = None) -> str:
    """Write `trace` to `path` atomically; gzip-compressed when the name ends in ``.gz``. Returns the path."""
    path = check_output_path(path)
    with atomic_output(path) as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as gz:
                _write(trace, gz, trace_name or path)
        else:
            _write(trace, raw, trace_name or path)
    return path


def dumps_chrome_trace(trace: Trace, trace_name: str = "") -> bytes:
    """The trace as JSON bytes (for small traces and tests)."""
    import io

    buf = io.BytesIO()
    _write(trace, buf, trace_name)
    return buf.getvalue()


def _write(trace: Trace, out: IO[bytes], trace_name: str) -> None:
    head = ['{\n  "schemaVersion": 1,\n  "deviceProperties": ', _json(device_properties(trace))]
    for key, value in trace.metadata.items():
        if key not in RESERVED_KEYS:
            head.append(f",\n  {_json(str(key))}: {_json(value)}")
    head.append(
        f',\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {int(trace.base_time_ns)},\n  "traceEvents": [\n'
    )
    out.write("".join(head).encode())
    first = True
    for chunk in iter_event_chunks(trace):
        if not chunk:
            continue
        out.write((("" if first else ",\n") + ",\n".join(chunk)).encode())
        first = False
    out.write(f'\n  ],\n  "traceName": {_json(trace_name)}\n}}\n'.encode())


def device_properties(trace: Trace) -> list[dict[str, Any]]:
    """Explicit `deviceProperties` entries, plus one per device that declared properties."""
    props = [dict(p) for p in trace.device_properties]
    covered = {(p.get("id"), p.get("name")) for p in props}
    for d in trace.devices:
        if d.properties and (d.index, d.name) not in covered:
            props.append({"id": d.index, "name": d.name, "type": d.type, **d.properties})
    return props


def iter_event_chunks(trace: Trace) -> Iterator[list[str]]:
    """The `traceEvents` entries as JSON strings, in chunks of at most CHUNK_ROWS activities."""
    offset = trace.epoch_offset_ns - trace.base_time_ns
    pids = np.array([d.pid for d in trace.devices], dtype=np.int64)
    tids = np.array([r.id for r in trace.resources] or [0], dtype=np.int64)
    acts = trace.activities
    n = len(acts)
    if n:
        names = np.array([_json(s) for s in acts.strings.strings], dtype=object)
        for lo in range(0, n, CHUNK_ROWS):
            yield _activity_chunk(acts, lo, min(n, lo + CHUNK_ROWS), offset, names, pids, tids)
    yield list(_counter_events(trace, offset, pids, tids))
    yield list(_metadata_events(trace, offset))


def _activity_chunk(
    acts: Any, lo: int, hi: int, offset: int, names: np.ndarray, pids: np.ndarray, tids: np.ndarray
) -> list[str]:
    c = {k: v[lo:hi] for k, v in acts.columns.items()}
    rel = np.maximum(c["start"] + offset, 0)
    dur = c["end"] - c["start"]
    pid_s = pids[c["device"]].tolist()
    tid_s = tids[c["resource"]].tolist()
    ts_q = (rel // 1000).tolist()
    ts_f = _FRACTION[rel % 1000].tolist()
    du_q = (dur // 1000).tolist()
    du_f = _FRACTION[dur % 1000].tolist()
    base = [
        f'{{"ph":"X","cat":{cat},"name":{name},"pid":{pid},"tid":{tid},"ts":{q}{f},"dur":{dq}{df}'
        for cat, name, pid, tid, q, f, dq, df in zip(
            names[c["cat"]].tolist(),
            names[c["name"]].tolist(),
            pid_s,
            tid_s,
            ts_q,
            ts_f,
            du_q,
            du_f,
            strict=True,
        )
    ]
    ends = ["}"] * (hi - lo)
    kind, ext, corr, flow = c["kind"], c["external_id"], c["correlation"], c["flow_id"]
    special = (
        (ext != 0)
        | (flow != 0)
        | (kind == int(ActivityKind.INSTANT))
        | ((corr != 0) & ~np.isin(kind, list(_NO_CORRELATION_ARG)))
    )
    row_args = acts.args
    if row_args:
        in_chunk = [i - lo for i in row_args if lo <= i < hi]
        if in_chunk:
            special[np.array(in_chunk)] = True
    for i in np.flatnonzero(special).tolist():
        k = int(kind[i])
        args: dict[str, Any] = {}
        if ext[i]:
            args["External id"] = int(ext[i])
        extra = row_args.get(lo + i)
        if corr[i] and k not in _NO_CORRELATION_ARG and not (extra and "correlation" in extra):
            args["correlation"] = int(corr[i])
        if extra:
            args.update(extra)
        if k == ActivityKind.INSTANT:
            base[i] = base[i].replace('"ph":"X"', '"ph":"i"', 1).rsplit(',"dur":', 1)[0] + ',"s":"t"'
        end = f',"args":{_json(args)}}}' if args else "}"
        fid = int(flow[i])
        if fid:
            ftype = FLOW_NAMES.get(int(c["flow_type"][i]), "ac2g")
            ph, tail = ("s", "") if c["flow_start"][i] else ("f", ',"bp":"e"')
            end += (
                f',\n{{"ph":"{ph}","id":{fid},"pid":{pid_s[i]},"tid":{tid_s[i]},'
                f'"ts":{ts_q[i]}{ts_f[i]},"cat":"{ftype}","name":"{ftype}"{tail}}}'
            )
        ends[i] = end
    return list(map(str.__add__, base, ends))


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
    yield f'{{"ph":"i","s":"g","name":"Record Window End","pid":"","tid":"","ts":{_us(trace.window[1] + offset)}}}'
