"""Backends used by the tests: a configurable faulty one and a small device simulator."""

from __future__ import annotations

import threading

import numpy as np

from polyprof.model import ActivityKind
from polyprof.plugin.backend import API_VERSION, Availability

HANG_RELEASE = threading.Event()  # set at the end of the test session to free abandoned threads


def _fail(backend: FaultyBackend, method: str) -> None:
    """The injected fault of `backend` in `method`: hang, raise KeyboardInterrupt, or raise an error."""
    if backend.fail_in != method:
        return
    if backend.mode == "hang":
        HANG_RELEASE.wait(120)
    elif backend.mode == "interrupt":
        raise KeyboardInterrupt(f"injected in {method}")
    else:
        raise RuntimeError(f"injected failure in {method}")


class FaultySession:
    def __init__(self, backend: FaultyBackend, ctx) -> None:
        self.b = backend
        self.ctx = ctx

    def _maybe_fail(self, method: str) -> None:
        _fail(self.b, method)

    def prepare(self):
        self._maybe_fail("prepare")

    def start(self):
        self._maybe_fail("start")

    def stop(self):
        self._maybe_fail("stop")

    def collect(self, sink):
        self._maybe_fail("collect")
        ws = self.ctx.window_start
        dev = sink.device(f"{self.b.name}:0", type="sim", index=0, name=f"{self.b.name} device")
        q = sink.resource(dev, 1, "queue 1")
        if self.b.rows == "malformed":
            sink.activity(ActivityKind.KERNEL, "ok", device=dev, resource=q, start=ws + 10, end=ws + 20)
            sink.activity(
                ActivityKind.KERNEL, "backwards", device=dev, resource=q, start=ws + 30, end=ws + 20
            )
            sink.activity(ActivityKind.KERNEL, "nodevice", device=7, resource=q, start=ws + 30, end=ws + 40)
            sink.activity(ActivityKind.KERNEL, "float", device=dev, resource=q, start=ws + 1.5, end=ws + 40)
            sink.activity(
                ActivityKind.KERNEL, "noresource", device=dev, resource=99, start=ws + 1, end=ws + 2
            )
        elif self.b.rows == "million":
            n = 1_000_000
            span = max(self.ctx.window_end - ws, 1)
            start = ws + (np.arange(n, dtype=np.int64) * span) // n
            sink.activities(
                {
                    "kind": np.full(n, int(ActivityKind.KERNEL)),
                    "name": ["k"] * n,
                    "device": np.full(n, dev),
                    "resource": np.full(n, q),
                    "start": start,
                    "end": start + 1,
                }
            )

    def close(self):
        self._maybe_fail("close")


class FaultyBackend:
    api_version = API_VERSION

    def __init__(
        self, name: str = "faulty", fail_in: str | None = None, mode: str = "raise", rows: str | None = None
    ):
        self.name = name
        self.activities = frozenset({name.upper()})
        self.fail_in = fail_in
        self.mode = mode
        self.rows = rows

    def probe(self) -> Availability:
        _fail(self, "probe")
        return Availability.yes(devices=["simulated"])

    def create_session(self, config, ctx):
        _fail(self, "create_session")
        self.sessions_created = getattr(self, "sessions_created", 0) + 1
        return FaultySession(self, ctx)


class SimDeviceSession:
    """Simulates a device: each `launch()` records a runtime call on the host and a kernel on a queue,
    linked by a flow and carrying the enclosing annotation's External id."""

    def __init__(self, ctx, clock_skew_ns: int = 0) -> None:
        self.ctx = ctx
        self.launches: list[tuple] = []
        self.active = False
        self.pushed: list[tuple[int, str]] = []
        self.stack: list[int] = []
        self.skew = clock_skew_ns
        self.closed = False

    def prepare(self):
        pass

    def start(self):
        self.active = True

    def stop(self):
        self.active = False

    def push_correlation(self, ident, kind):
        self.pushed.append((ident, kind))
        self.stack.append(ident)

    def pop_correlation(self, kind):
        self.stack.pop()

    def launch(self, name: str) -> None:
        if not self.active:
            return
        t0 = self.ctx.clock()
        corr = self.ctx.new_correlation_id()
        ext = self.ctx.current_external_id()
        t1 = self.ctx.clock()
        self.launches.append(
            (name, corr, ext, t0, t1, threading.get_native_id(), self.stack[-1] if self.stack else 0)
        )

    def collect(self, sink):
        host = sink.host_device()
        dev = sink.device("sim:0", type="sim", index=0, name="Sim GPU", properties={"memory": 1 << 30})
        q = sink.resource(dev, 7, "queue 7")
        for name, corr, ext, t0, t1, tid, stacked in self.launches:
            thr = sink.host_thread(tid)
            sink.activity(
                ActivityKind.RUNTIME,
                "simLaunch",
                device=host,
                resource=thr,
                start=t0,
                end=t1,
                cat="sim_runtime",
                correlation=corr,
                external_id=ext,
                flow_id=corr,
                flow_start=True,
            )
            sink.activity(
                ActivityKind.KERNEL,
                name,
                device=dev,
                resource=q,
                start=t1 + 100,
                end=t1 + 600,
                correlation=corr,
                external_id=stacked or ext,
                flow_id=corr,
                args={"grid": [1, 1, 1]},
            )

    def close(self):
        self.active = False
        self.closed = True


class SimDeviceBackend:
    name = "simdev"
    api_version = API_VERSION
    activities = frozenset({"SIMDEV"})

    def __init__(self) -> None:
        self.sessions: list[SimDeviceSession] = []

    def probe(self):
        return Availability.yes(devices=["Sim GPU"])

    def create_session(self, config, ctx):
        s = SimDeviceSession(ctx)
        self.sessions.append(s)
        return s

    def launch(self, name: str) -> None:
        for s in self.sessions:
            s.launch(name)
