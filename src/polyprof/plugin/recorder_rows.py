"""polyprof's own recorder's events as Sink rows: what the ``host`` backend hands over while recording,
and what the crash reader (:mod:`polyprof.formats.spill.crash`) makes of the rows a crashed process
left. One place for both, so that a crash's spans read as a recording's::

    rows, names, args = _native.snapshot(buffer)
    thread_rows(sink, sink.host_device(), sink.host_thread(tid), rows, names, args)
    unfinished_spans(sink, host, thread_row, _native.open_states(buffer), end_ns)
"""

from __future__ import annotations

import numpy as np

from polyprof import _native
from polyprof.model import ActivityKind, ArgColumns, CodedStrings
from polyprof.model.strings import as_name, code_strings, present_rows
from polyprof.plugin.sink import Sink

#: a buffer's event type -> the activity kind it becomes (counters become counter samples)
KIND_OF_TYPE = np.zeros(4, dtype=np.int64)
KIND_OF_TYPE[_native.SPAN] = int(ActivityKind.USER_ANNOTATION)
KIND_OF_TYPE[_native.INSTANT] = int(ActivityKind.INSTANT)
KIND_OF_TYPE[_native.GC] = int(ActivityKind.PYTHON_FUNCTION)


def thread_rows(sink: Sink, host: int, thread_row: int, rows: np.ndarray, names: list, args: list) -> None:
    """A thread's events as columns: a span's own id is its correlation and External id; an instant
    points at its parent. Spans that were also torch ranges while a consumer asked for ids (an
    ExecutionTraceObserver) carry torch's "Record function id"."""
    types = rows[:, 0]
    for i in np.flatnonzero(types == _native.COUNTER).tolist():
        sink.counter(as_name(names[i]), args[i], ts=int(rows[i, 1]))
    keep = np.flatnonzero(types != _native.COUNTER)
    if not len(keep):
        return
    everything = len(keep) == len(rows)
    is_span = types[keep] == _native.SPAN
    codes, table = code_strings(names)
    present = present_rows(args)
    position = present if everything else np.searchsorted(keep, present)
    if not everything:
        kept = np.isin(present, keep)
        present, position = present[kept], position[kept]
    row_args: dict[int, dict] = {}
    handles = np.zeros(len(keep), dtype=np.int64)
    for out_i, i in zip(position.tolist(), present.tolist(), strict=True):
        a = args[i]
        if type(a) is _native.Routed:  # also a torch range: its handle is torch's id
            handles[out_i] = a.handle
            a = a.args
            if a is None:
                continue
        row_args[out_i] = a if isinstance(a, dict) else {"args": a}
    ident = rows[keep, 3]
    sink.activities(
        {
            "kind": KIND_OF_TYPE[types[keep]],
            "name": CodedStrings(codes[keep], [as_name(n) for n in table]),
            "device": np.full(len(keep), host),
            "resource": np.full(len(keep), thread_row),
            "start": rows[keep, 1],
            "end": rows[keep, 2],
            "correlation": np.where(is_span, ident, 0),
            "external_id": np.where(is_span, ident, rows[keep, 4]),
        },
        row_args,
        ArgColumns(("Record function id",), (handles,)) if handles.any() else None,
    )


def unfinished_spans(sink: Sink, host: int, thread_row: int, open_spans: list[tuple], end: int | None) -> None:
    """(name, args, start, id, parent) of spans still open on a thread when the profile stopped (or a
    dump was taken, or the process crashed): written up to `end` with ``"finished": false``, as Kineto
    writes unfinished CPU ops."""
    if end is None:
        return
    for name, span_args, start, ident, _parent in open_spans:
        if start > end:
            continue
        args = span_args if isinstance(span_args, dict) else ({"args": span_args} if span_args is not None else {})
        sink.activity(
            ActivityKind.USER_ANNOTATION,
            as_name(name),
            device=host,
            resource=thread_row,
            start=start,
            end=end,
            correlation=ident,
            external_id=ident,
            args={**args, "finished": False},
        )
