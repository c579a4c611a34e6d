"""The ``host`` backend: turns what ``polyprof.record_function``, ``polyprof.instant`` and
``polyprof.counter`` recorded into activities on the host process (activity group CPU)."""

from __future__ import annotations

import gc
import platform
from typing import Any

import numpy as np

from polyprof import annotations
from polyprof.backend import API_VERSION, Availability, ProfileConfig, SessionContext, Sink
from polyprof.clock import host_ns
from polyprof.model import ActivityKind, ArgColumns


class HostSession:
    # polyprof's own in-process bookkeeping cannot hang, so the engine calls it on the profile's
    # thread instead of a guard thread (whose start can wait milliseconds for a CPU under load)
    thread_affine = True

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.gc_events = bool(config.extra.get("record_python_gc_info"))
        self._running = False
        self._gc_start: dict[int, int] = {}

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        annotations.recorder.begin()
        self._running = True
        if self.gc_events:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._running:
            annotations.recorder.end()
            self._running = False
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """Each garbage collection as a "Python GC" python_function span on the collecting thread, as
        torch.profiler records it with record_python_gc_info."""
        import threading

        tid = threading.get_native_id()
        if phase == "start":
            self._gc_start[tid] = host_ns()
        elif phase == "stop" and tid in self._gc_start and annotations.recorder.active:
            start = self._gc_start.pop(tid)
            annotations.recorder.buffer().add(
                annotations.GC, start, host_ns(), "Python GC", 0, 0, {"generation": info.get("generation")}
            )

    def collect(self, sink: Sink) -> None:
        host = sink.host_device()
        for buf in annotations.recorder.buffers():
            self._unfinished(sink, host, buf)
            rows, names, args = annotations.snapshot(buf.events)
            if not len(rows):
                continue
            thread_row = sink.host_thread(buf.tid, buf.name)
            kinds = rows[:, 0]
            for i in np.flatnonzero(kinds == annotations.COUNTER).tolist():
                sink.counter(names[i], args[i], ts=int(rows[i, 1]))
            for kind, rows_of_kind in (
                (ActivityKind.USER_ANNOTATION, np.flatnonzero(kinds == annotations.SPAN)),
                (ActivityKind.INSTANT, np.flatnonzero(kinds == annotations.INSTANT)),
                (ActivityKind.PYTHON_FUNCTION, np.flatnonzero(kinds == annotations.GC)),
            ):
                if len(rows_of_kind):
                    self._rows(sink, host, thread_row, kind, rows_of_kind, rows, names, args)

    @staticmethod
    def _rows(
        sink: Sink,
        host: int,
        thread_row: int,
        kind: ActivityKind,
        keep: np.ndarray,
        rows: np.ndarray,
        names: list,
        args: list,
    ) -> None:
        """One kind's rows of a thread buffer: a span's own id is its correlation and External id; an
        instant points at its parent. Spans that were also torch ranges while a consumer asked for ids (an
        ExecutionTraceObserver) carry torch's "Record function id"."""
        is_span = kind == ActivityKind.USER_ANNOTATION
        ident = rows[keep, 3]
        row_args = {}
        handles = np.zeros(len(keep), dtype=np.int64) if is_span else None
        for out_i, i in enumerate(keep.tolist()):
            a = args[i]
            if a is None:
                continue
            if type(a) is annotations.Routed:  # also a torch range: its handle is torch's id
                handles[out_i] = a.handle
                a = a.args
                if a is None:
                    continue
            row_args[out_i] = a if isinstance(a, dict) else {"args": a}
        sink.activities(
            {
                "kind": np.full(len(keep), int(kind)),
                "name": [str(names[i]) for i in keep.tolist()],
                "device": np.full(len(keep), host),
                "resource": np.full(len(keep), thread_row),
                "start": rows[keep, 1],
                "end": rows[keep, 2],
                "correlation": ident if is_span else np.zeros(len(keep), dtype=np.int64),
                "external_id": ident if is_span else rows[keep, 4],
            },
            row_args,
            ArgColumns(("Record function id",), (handles,)) if is_span and handles.any() else None,
        )

    def _unfinished(self, sink: Sink, host: int, buf: annotations.ThreadBuffer) -> None:
        """Spans still open when the profile stopped: written up to the end of the window with
        ``"finished": false``, as Kineto writes unfinished CPU ops."""
        end = self.ctx.window_end
        if end is None:
            return
        for span in buf.events.open_spans():
            state = span.open_state
            if state is None or state[0] > end:
                continue
            start, ident, _parent = state
            args = (
                span.args
                if isinstance(span.args, dict)
                else ({"args": span.args} if span.args is not None else {})
            )
            sink.activity(
                ActivityKind.USER_ANNOTATION,
                str(span.name),
                device=host,
                resource=sink.host_thread(buf.tid, buf.name),
                start=start,
                end=end,
                correlation=ident,
                external_id=ident,
                args={**args, "finished": False},
            )

    def close(self) -> None:
        self.stop()


class HostBackend:
    """Always available: it needs nothing but Python."""

    name = "host"
    api_version = API_VERSION
    activities = frozenset({"CPU"})

    def probe(self) -> Availability:
        return Availability.yes(devices=["host process"], python=platform.python_version())

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> HostSession:
        return HostSession(config, ctx)


backend = HostBackend()
