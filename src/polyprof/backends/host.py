"""The ``host`` backend: turns what ``polyprof.record_function``, ``polyprof.instant`` and
``polyprof.counter`` recorded into activities on the host process (activity group CPU)."""

from __future__ import annotations

import platform

import numpy as np

from polyprof import annotations
from polyprof.backend import API_VERSION, Availability, ProfileConfig, SessionContext, Sink
from polyprof.model import ActivityKind


class HostSession:
    # polyprof's own in-process bookkeeping cannot hang, so the engine calls it on the profile's
    # thread instead of a guard thread (whose start can wait milliseconds for a CPU under load)
    thread_affine = True

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self._running = False

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        annotations.recorder.begin()
        self._running = True

    def stop(self) -> None:
        if self._running:
            annotations.recorder.end()
            self._running = False

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
            keep = np.flatnonzero(kinds != annotations.COUNTER)
            if not len(keep):
                continue
            is_span = kinds[keep] == annotations.SPAN
            ident = rows[keep, 3]
            row_args = {}
            for out_i, i in enumerate(keep.tolist()):
                a = args[i]
                if a is not None:
                    row_args[out_i] = a if isinstance(a, dict) else {"args": a}
            sink.activities(
                {
                    "kind": np.where(is_span, int(ActivityKind.USER_ANNOTATION), int(ActivityKind.INSTANT)),
                    "name": [str(names[i]) for i in keep.tolist()],
                    "device": np.full(len(keep), host),
                    "resource": np.full(len(keep), thread_row),
                    "start": rows[keep, 1],
                    "end": rows[keep, 2],
                    # a span's own id is its correlation and External id; an instant points at its parent
                    "correlation": np.where(is_span, ident, 0),
                    "external_id": np.where(is_span, ident, rows[keep, 4]),
                },
                row_args,
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
        return HostSession(ctx)


backend = HostBackend()
