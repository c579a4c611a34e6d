"""Reading Kineto-dialect Chrome traces (written by polyprof or torch.profiler) into a Trace.

::

    from polyprof.io import load_trace
    trace = load_trace("trace.json.gz")

A file that is truncated, not JSON or not a trace raises :class:`polyprof.errors.TraceFormatError`
with a one-line message naming the file and the problem.
"""

from __future__ import annotations

import math
import os
import stat
import zlib
from typing import Any

import ijson
import orjson

from polyprof.errors import TraceFormatError
from polyprof.io.source import TokenBound, inflate, max_trace_bytes, max_value_bytes, trace_chunks
from polyprof.model import (
    FLOW_AC2G,
    FLOW_FWDBWD,
    TRACE_TIME_LIMIT_NS,
    ActivityBuilder,
    ActivityKind,
    BackendStatus,
    Counters,
    Device,
    Resource,
    Trace,
    kind_from_category,
)

_FLOW_TYPES = {"ac2g": FLOW_AC2G, "fwdbwd": FLOW_FWDBWD}
ENVELOPE_PIDS = ("Spans", "Traces")


def _ns(value: Any, path: str, what: str) -> int:
    """Microseconds (number or numeric string, as Kineto writes) -> integer ns."""
    if isinstance(value, bool) or value is None:
        raise TraceFormatError(f"{path}: {what} has no valid timestamp")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise TraceFormatError(f"{path}: {what} has a non-numeric timestamp {value!r}") from None
    if isinstance(value, int):
        ns = value * 1000
    elif isinstance(value, float) and math.isfinite(value):
        ns = int(round(value * 1000))
    else:
        raise TraceFormatError(f"{path}: {what} has a non-numeric or non-finite timestamp {str(value)[:40]!r}")
    if not -TRACE_TIME_LIMIT_NS <= ns <= TRACE_TIME_LIMIT_NS:
        raise TraceFormatError(f"{path}: {what} has a timestamp out of range ({value})")
    return ns


def load_trace(path: str | os.PathLike, *, max_bytes: int | None = None) -> Trace:
    """Load a trace file into a :class:`Trace`: Chrome trace JSON (polyprof's or torch.profiler's) or
    Perfetto protobuf (``.pftrace``), either one gzip-compressed or not, told apart by their bytes.
    Anything wrong with the file is a TraceFormatError naming the file and the problem, in one line."""
    path = os.fspath(path)
    limit = max_bytes or max_trace_bytes()
    scanned = _scanned_file(path, limit)
    if scanned is not None:
        return scanned
    chunks = trace_chunks(path, limit)
    data = _first_bytes(chunks, max_value_bytes() + 1)
    from polyprof.io.perfetto import looks_like_perfetto

    if len(data) > max_value_bytes() and _is_gzip(path) and not looks_like_perfetto(data):
        chunks.close()
        del data
        _check_tokens(trace_chunks(path, limit), path)
        chunks = trace_chunks(path, limit)
        data = b""
    try:
        return parse_trace(data + b"".join(chunks), path)
    except MemoryError:
        raise TraceFormatError(f"{path}: there is not enough memory to read it ({os.path.getsize(path):,} bytes)") from None


def _first_bytes(chunks: Any, at_least: int) -> bytes:
    parts = []
    size = 0
    for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size >= at_least:
            break
    return b"".join(parts)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _check_tokens(chunks: Any, path: str) -> None:
    """Refuse (TraceFormatError) gzip JSON holding one token longer than the token limit, reading it as a
    stream that holds at most that limit: what it inflates to is not known before, and a small gzip
    can hold one string of gigabytes. (Parsing the whole stream with ijson instead holds only the events,
    but took 2.1x the time and 1.3x the memory of orjson over the inflated bytes: ijson's dicts do not
    share their keys. This pass takes about what orjson's parse takes.)"""
    source = TokenBound(chunks, path)
    try:
        for _ in source.tokens(ijson.basic_parse(source, use_float=True)):
            pass
    except ijson.JSONError as exc:
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        problem = "is truncated" if "premature" in said else "is not valid JSON"
        raise TraceFormatError(f"{path}: {problem} ({said})") from None


def _scanned_file(path: str, limit: int) -> Trace | None:
    """The JSON trace at `path` read by the C scanner (io/chrome_scan.py), or None: not built, not a
    plain JSON trace file, or something the scanner leaves to the reader (which then says what is wrong)."""
    from polyprof.io import chrome_scan

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return chrome_scan.scan_file(path, limit)
    except (OSError, EOFError, zlib.error, chrome_scan.Declined):
        return None


def parse_trace(data: bytes, path: str = "<trace>") -> Trace:
    """A trace from its bytes, JSON or Perfetto protobuf (`path` names it in errors)."""
    if data[:2] == b"\x1f\x8b":
        data = inflate(data, path, max_trace_bytes())
    from polyprof.io.perfetto import looks_like_perfetto, parse_perfetto

    if looks_like_perfetto(data):
        return parse_perfetto(data, path)
    if not data.strip():
        raise TraceFormatError(f"{path}: the file is empty")
    from polyprof.io import chrome_scan

    try:
        scanned = chrome_scan.scan_trace(data, path)
    except chrome_scan.Declined:
        scanned = None
    if scanned is not None:
        return scanned
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        problem = (
            "is truncated"
            if "unexpected end" in str(exc).lower() or "eof" in str(exc).lower()
            else "is not valid JSON"
        )
        raise TraceFormatError(f"{path}: {problem} ({exc})") from None
    return _trace_of(doc, path)


def _trace_of(doc: Any, path: str) -> Trace:
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: JSON but not a Chrome trace (no traceEvents list)")
    where = _Where()
    try:
        return _build(doc, path, where)
    except TraceFormatError:
        raise
    except Exception as exc:  # any other structural surprise: one line, never a traceback
        raise TraceFormatError(f"{path}: {where.what} is malformed ({type(exc).__name__}: {str(exc)[:120]})") from None


class _Where:
    """What the reader was reading when it met a surprise (for the error line)."""

    __slots__ = ("what",)

    def __init__(self) -> None:
        self.what = "the trace"


def _hashable(value: Any) -> Any:
    """A pid or tid usable as a key (a list or dict given as one becomes its text)."""
    try:
        hash(value)
        return value
    except TypeError:
        return orjson.dumps(value, default=repr).decode()


def _build(doc: dict[str, Any], path: str, where: _Where) -> Trace:
    devices: list[Device] = []
    dev_by_pid: dict[Any, int] = {}
    resources: list[Resource] = []
    res_by_key: dict[tuple[int, Any], int] = {}

    def device(pid: Any) -> int:
        idx = dev_by_pid.get(pid)
        if idx is None:
            idx = dev_by_pid[pid] = len(devices)
            pid_int = pid if isinstance(pid, int) else -1 - len(devices)
            devices.append(
                Device(f"pid:{pid}", "unknown", pid_int if pid_int >= 0 else 0, f"process {pid}", pid=pid_int)
            )
        return idx

    def resource(dev: int, tid: Any) -> int:
        key = (dev, tid)
        idx = res_by_key.get(key)
        if idx is None:
            idx = res_by_key[key] = len(resources)
            tid_int = tid if isinstance(tid, int) else len(resources)
            resources.append(Resource(dev, tid_int, f"thread {tid}", tid_int))
        return idx

    builder = ActivityBuilder()
    counters = Counters()
    at_position: dict[tuple[Any, Any, int], int] = {}
    pending_flows: list[tuple[dict, int, int]] = []  # (event, ts, row of the X event just before it)
    last_row = -1
    events = doc["traceEvents"]
    for n, ev in enumerate(events):
        where.what = f"traceEvents[{n}]"
        if not isinstance(ev, dict):
            raise TraceFormatError(f"{path}: traceEvents[{n}] is not an object")
        if "pid" in ev:
            ev["pid"] = _hashable(ev["pid"])
        if "tid" in ev:
            ev["tid"] = _hashable(ev["tid"])
        ph = ev.get("ph")
        if ev.get("cat") == "Trace" or ev.get("pid") in ENVELOPE_PIDS:
            continue  # Kineto's envelope ("PyTorch Profiler (0)" on "Spans"): the profile, not an activity
        if ph == "M":
            _metadata_row(ev, devices, resources, device, resource)
            continue
        if ph not in ("X", "i", "I", "C", "s", "f", "t"):
            continue
        pid, tid = ev.get("pid"), ev.get("tid")
        if ph == "i" and ev.get("s") == "g":
            continue  # "Record Window End" and other global markers
        ts = _ns(ev.get("ts"), path, f"traceEvents[{n}]")
        dev = device(pid)
        if ph == "C":
            args = ev.get("args") or {}
            if not isinstance(args, dict):
                raise TraceFormatError(f"{path}: traceEvents[{n}] (a counter) has args that are not an object")
            for key, value in args.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    counters.add(
                        str(ev.get("name", key)) if len(args) == 1 else f"{ev.get('name', '')}.{key}",
                        dev,
                        ts,
                        float(value),
                    )
            continue
        if ph in ("s", "f", "t"):
            pending_flows.append((ev, ts, last_row))
            continue
        cat = str(ev.get("cat", ""))
        res = resource(dev, tid)
        raw_args = ev.get("args") or {}
        if not isinstance(raw_args, dict):
            raise TraceFormatError(f"{path}: traceEvents[{n}] has args that are not an object")
        args = dict(raw_args)
        ext = args.pop("External id", 0)
        corr = args.get("correlation", 0)
        if ph == "X":
            kind = kind_from_category(cat)
            dur = _ns(ev.get("dur", 0), path, f"traceEvents[{n}] dur")
        else:
            kind, dur = ActivityKind.INSTANT, 0
        row = builder.append(
            kind,
            cat,
            str(ev.get("name", "")),
            dev,
            res,
            ts,
            ts + max(0, dur),
            corr if isinstance(corr, int) and not isinstance(corr, bool) and -(2**63) <= corr < 2**63 else 0,
            ext if isinstance(ext, int) and not isinstance(ext, bool) and -(2**63) <= ext < 2**63 else 0,
            args=args or None,
        )
        at_position[(pid, tid, ts)] = row
        last_row = row
    flow_cols = builder._cols
    positions = (flow_cols["device"], flow_cols["resource"], flow_cols["start"])
    for ev, ts, previous in pending_flows:
        # Kineto writes a flow event right after its activity; fall back to matching the position
        row = (
            previous
            if previous >= 0 and positions[2][previous] == ts and _same_pid(previous, ev, devices, positions)
            else None
        )
        if row is None:
            row = at_position.get((ev.get("pid"), ev.get("tid"), ts))
        fid = ev.get("id")
        if row is None or not isinstance(fid, int) or isinstance(fid, bool) or not 0 < fid < 2**63:
            continue
        flow_cols["flow_id"][row] = fid
        flow_cols["flow_type"][row] = _FLOW_TYPES.get(str(ev.get("cat", "ac2g")), FLOW_AC2G)
        flow_cols["flow_start"][row] = 1 if ev.get("ph") == "s" else 0
    return _finish(doc, builder.freeze(), devices, resources, counters, where)


def _finish(
    doc: dict[str, Any], acts: Any, devices: list[Device], resources: list[Resource], counters: Counters,
    where: _Where | None = None,
) -> Trace:
    """The trace of the events read (`acts` and the rest) and the document's top-level keys."""
    base = doc.get("baseTimeNanoseconds", 0)
    base = base if isinstance(base, int) else 0
    metadata = {
        k: v
        for k, v in doc.items()
        if k
        not in (
            "traceEvents",
            "deviceProperties",
            "schemaVersion",
            "displayTimeUnit",
            "baseTimeNanoseconds",
            "traceName",
        )
    }
    if where is not None:
        where.what = "the polyprof metadata"
    statuses, timings = _statuses(metadata)
    start = int(acts["start"].min()) if len(acts) else 0
    end = int(acts["end"].max()) if len(acts) else 0
    props = doc.get("deviceProperties") if isinstance(doc.get("deviceProperties"), list) else []
    props = [p for p in props if isinstance(p, dict)]
    return Trace(
        activities=acts,
        devices=devices,
        resources=resources,
        counters=counters,
        metadata=metadata,
        device_properties=props,
        backends=statuses,
        epoch_offset_ns=base,  # times read back are relative to baseTimeNanoseconds
        base_time_ns=base,
        window=(start, end),
        timings_ms=timings,
    )


def _statuses(metadata: dict) -> tuple[dict[str, BackendStatus], dict[str, Any]]:
    """The backends' statuses and the trace's phase timings out of polyprof's metadata (which keeps
    neither: the trace's statuses are their one owner, serialised again when it is written)."""
    own = metadata.get("polyprof")
    if not isinstance(own, dict):
        return {}, {}
    own = dict(own)
    metadata["polyprof"] = own
    backends, timings = own.pop("backends", None), own.pop("postprocess_ms", None)
    statuses = {
        name: BackendStatus.from_json(name, doc)
        for name, doc in (backends.items() if isinstance(backends, dict) else ())
        if isinstance(doc, dict)
    }
    trace_timings: dict[str, Any] = {}
    for key, value in (timings.items() if isinstance(timings, dict) else ()):
        if isinstance(value, dict) and key in statuses:
            statuses[key].timings_ms = dict(value)
        elif isinstance(value, dict) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            trace_timings[key] = value  # a number, or a phase's parts (merge_passes)
    return statuses, trace_timings


def _same_pid(row: int, ev: dict, devices: list[Device], positions: tuple) -> bool:
    return devices[positions[0][row]].key == f"pid:{ev.get('pid')}"


def _metadata_row(
    ev: dict, devices: list[Device], resources: list[Resource], device: Any, resource: Any
) -> None:
    name, args = ev.get("name"), ev.get("args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"a metadata row ({str(name)[:40]}) has args that are not an object")
    dev = device(ev.get("pid"))
    is_thread = name in ("thread_name", "thread_sort_index")
    apply_metadata(name, args, devices[dev], resources[resource(dev, ev.get("tid"))] if is_thread else None)


def apply_metadata(name: Any, args: dict, device: Device, resource: Resource | None) -> None:
    """A process or thread metadata row (``ph: "M"``) applied to its device or its thread."""
    if name == "process_name":
        device.name = str(args.get("name", device.name))
    elif name == "process_labels":
        device.label = str(args.get("labels", ""))
        if device.label == "CPU":
            device.type = "cpu"
        elif device.label.startswith("GPU"):  # Kineto's label of every GPU process
            device.type = "gpu"
    elif name == "process_sort_index":
        device.sort_index = _int(args.get("sort_index", 0))
    elif name == "thread_name" and resource is not None:
        resource.name = str(args.get("name", ""))
    elif name == "thread_sort_index" and resource is not None:
        resource.sort_index = _int(args.get("sort_index", 0))


def _int(value: Any) -> int:
    """A sort index as written, or 0 when it is not a number that fits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return int(max(min(value, 2**62), -(2**62)))
