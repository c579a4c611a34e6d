"""Twins of the writers' C encoders, for interpreters without polyprof's extension: the same bytes as
``_native/csrc/chrome_format.c``'s ``format_activities`` and ``format_arg_objects`` and
``perfetto_format.c``'s ``slice_events``, which the suite checks side by side (``_native`` gives one or
the other; callers never know which)."""

from __future__ import annotations

import functools
import heapq
import math
from typing import Any

from polyprof._native.shared import (
    FLAG_CORRELATION,
    FLAG_FLOW_START,
    FLAG_INSTANT,
    FLOW_NAMES,
    SLICE_BEGIN,
    SLICE_END,
    SLICE_INSTANT,
    np,
)


@functools.cache
def _fractions() -> Any:
    """".000" to ".999": a timestamp's microsecond fraction (made on first use: numpy loads then)."""
    return np.array([f".{i:03d}" for i in range(1000)], dtype=object)


def format_activities(cols: tuple[Any, ...], offset: int, names: list[bytes], extra: list[bytes | None]) -> bytes:
    """The rows' Chrome JSON events, joined by ``,\\n``: `cols` are (cat, name, pid, tid, start, end, ext,
    corr, flow, flow type, flags) as int64 arrays, `names` the JSON strings `cat` and `name` index, `extra`
    each row's args object (None: its ids alone)."""
    return _format_text(cols, offset, [s.decode() for s in names], [x and x.decode() for x in extra]).encode()


def format_arg_objects(ext: Any, corr: Any, keys: list[bytes], columns: list[Any]) -> list[bytes]:
    """One args JSON object per row: ``{"External id":ext,"correlation":corr,key:value,...}``, the ids
    left out where 0. A column is an int64 array, a float64 array (written as Python's repr writes it,
    NaN and infinities as null) or a list of JSON values already encoded, an empty one leaving the key
    out of that row."""
    texts = []
    for key, column in zip(keys, columns, strict=True):
        if isinstance(column, list):
            values = column
        elif column.dtype.kind == "f":
            values = [repr(v).encode() if math.isfinite(v) else b"null" for v in column.tolist()]
        else:
            values = [str(v).encode() for v in column.tolist()]
        texts.append((key + b":", values))
    out = []
    for i, (e, c) in enumerate(zip(ext.tolist(), corr.tolist(), strict=True)):
        parts = [b'"External id":%d' % e] if e else []
        if c:
            parts.append(b'"correlation":%d' % c)
        parts += [key + values[i] for key, values in texts if values[i]]
        out.append(b"{" + b",".join(parts) + b"}")
    return out


def _format_text(cols: tuple[np.ndarray, ...], offset: int, names: list[str], extra: list[Any]) -> str:
    """Rows grouped by shape, each group formatted by one comprehension."""
    cat, name, pid, tid, start, end, ext, corr, flow, ftype, flags = cols
    ts = np.maximum(start + offset, 0)
    dur = np.maximum(end - start, 0)
    n = len(cat)
    pid_s, tid_s = pid.tolist(), tid.tolist()
    ts_s = list(map(str.__add__, map(str, (ts // 1000).tolist()), _fractions()[ts % 1000].tolist()))
    du_s = list(map(str.__add__, map(str, (dur // 1000).tolist()), _fractions()[dur % 1000].tolist()))
    name_arr = np.array(names, dtype=object)
    base = [
        f'{{"ph":"X","cat":{c},"name":{nm},"pid":{p},"tid":{t},"ts":{s},"dur":{d}'
        for c, nm, p, t, s, d in zip(
            name_arr[cat].tolist(), name_arr[name].tolist(), pid_s, tid_s, ts_s, du_s, strict=True
        )
    ]
    for i in np.flatnonzero(flags & FLAG_INSTANT).tolist():
        base[i] = base[i].replace('"ph":"X"', '"ph":"i"', 1).rsplit(',"dur":', 1)[0] + ',"s":"t"'
    tail = ["}"] * n
    ext_l, corr_l, with_corr = ext.tolist(), corr.tolist(), (flags & FLAG_CORRELATION) != 0
    for i in np.flatnonzero((ext != 0) | with_corr).tolist():
        if ext_l[i] and with_corr[i]:
            tail[i] = f',"args":{{"External id":{ext_l[i]},"correlation":{corr_l[i]}}}}}'
        elif ext_l[i]:
            tail[i] = f',"args":{{"External id":{ext_l[i]}}}}}'
        else:
            tail[i] = f',"args":{{"correlation":{corr_l[i]}}}}}'
    for i, x in enumerate(extra):
        if x is not None:
            tail[i] = f',"args":{x}}}'
    flow_l, ftype_l = flow.tolist(), ftype.tolist()
    for i in np.flatnonzero(flow != 0).tolist():
        fname = FLOW_NAMES.get(ftype_l[i])
        if fname is None:
            continue
        ph, bp = ("s", "") if flags[i] & FLAG_FLOW_START else ("f", ',"bp":"e"')
        tail[i] += (
            f',\n{{"ph":"{ph}","id":{flow_l[i]},"pid":{pid_s[i]},"tid":{tid_s[i]},'
            f'"ts":{ts_s[i]},"cat":"{fname}","name":"{fname}"{bp}}}'
        )
    return ",\n".join(map(str.__add__, base, tail))


def slice_events(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, instant: np.ndarray, order: np.ndarray
) -> tuple[bytes, bytes]:
    """``(events, lane)`` as bytes of int64 and int32, as C gives them (see polyprof.formats.perfetto.order)."""
    n = len(order)
    lane = np.zeros(n, dtype=np.int32)
    out: list[int] = []
    pending: list[tuple[int, int, int]] = []  # (end, -begin number, row): the inner of equal ends first
    lanes: dict[int, list[list[int]]] = {}  # track -> each lane's stack of open ends
    track_l, start_l, end_l, instant_l = track.tolist(), start.tolist(), end.tolist(), instant.tolist()
    begun = 0
    for row in order.tolist():
        s = start_l[row]
        while pending and pending[0][0] <= s:
            out.append(heapq.heappop(pending)[2] << 2 | SLICE_END)
        if instant_l[row]:
            out.append(row << 2 | SLICE_INSTANT)
            continue
        e = end_l[row]
        stacks = lanes.setdefault(track_l[row], [])
        k = 0
        while k < len(stacks):
            stack = stacks[k]
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or stack[-1] >= e:
                break
            k += 1
        if k == len(stacks):
            stacks.append([])
        stacks[k].append(e)
        lane[row] = k
        out.append(row << 2 | SLICE_BEGIN)
        begun += 1
        heapq.heappush(pending, (e, -begun, row))
    while pending:
        out.append(heapq.heappop(pending)[2] << 2 | SLICE_END)
    return np.array(out, dtype=np.int64).tobytes(), lane.tobytes()
