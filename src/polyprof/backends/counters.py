"""The ``counters`` backend: the process's and the system's CPU, memory, threads and I/O as counter
tracks beside the timeline (activity group COUNTERS; available where psutil is installed:
``pip install 'polyprof[counters]'``).

::

    with polyprof.profile(backend_options={"counters": {"interval_ms": 50}}) as prof: ...

One daemon thread (``polyprof-counters``) samples while the profile records, every ``interval_ms``
(default 100: about 60 us of psutil calls ten times a second, which the annotation benchmark cannot
tell from noise); the samples become counter tracks on the host process at the end of the window.
Tracks: ``process cpu %`` (of one core), ``process rss (MB)``, ``process threads``, ``process read
(MB/s)`` and ``process write (MB/s)`` where the system counts a process's I/O, ``system cpu %``,
``system memory used %``. ``polyprof.counter`` (user counters) works beside them.
"""

from __future__ import annotations

import threading
from typing import Any

from polyprof.backend import API_VERSION, Availability, ProfileConfig, SessionContext
from polyprof.clock import host_ns
from polyprof.options import Option, OptionSchema
from polyprof.sink import Sink

OPTIONS = OptionSchema(Option("interval_ms", float, default=100.0, minimum=1, help="time between samples"))
THREAD_NAME = "polyprof-counters"
MB = 1 << 20


class Sampler:
    """What one sample reads (psutil), with the rates computed from the previous sample."""

    def __init__(self, psutil: Any) -> None:
        self.psutil = psutil
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call starts the measurement
        psutil.cpu_percent(None)
        self.io = self._io()
        self.at = host_ns()

    def _io(self) -> tuple[int, int] | None:
        try:
            c = self.process.io_counters()
            return c.read_bytes, c.write_bytes
        except (AttributeError, OSError, self.psutil.Error):
            return None  # not counted here (macOS, some containers)

    def sample(self) -> tuple[int, list[tuple[str, float]]]:
        p, now = self.process, host_ns()
        with p.oneshot():
            values = [("process cpu %", p.cpu_percent(None)), ("process rss (MB)", p.memory_info().rss / MB),
                      ("process threads", float(p.num_threads()))]  # fmt: skip
        io = self._io()
        if io is not None and self.io is not None and now > self.at:
            seconds = (now - self.at) / 1e9
            values += [("process read (MB/s)", (io[0] - self.io[0]) / MB / seconds),
                       ("process write (MB/s)", (io[1] - self.io[1]) / MB / seconds)]  # fmt: skip
        self.io, self.at = io, now
        values += [("system cpu %", self.psutil.cpu_percent(None)), ("system memory used %", self.psutil.virtual_memory().percent)]
        return now, values


class CountersSession:
    in_process = True  # polyprof's own: called directly, not on a guard thread

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.interval_s = float(ctx.options.get("interval_ms") or 100.0) / 1000
        self.samples: list[tuple[int, list[tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        import psutil

        sampler = Sampler(psutil)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(sampler,), name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self, sampler: Sampler) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append(sampler.sample())
            except Exception as exc:  # a process gone odd: say it once, keep sampling what can be read
                self.errors += 1
                if self.errors == 1:
                    self.ctx.report.warning(f"a counter sample failed: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def collect(self, sink: Sink) -> None:
        samples, self.samples = self.samples, []
        for ts, values in samples:
            for name, value in values:
                sink.counter(name, value, ts=ts)
        self.ctx.report.detail("samples", len(samples))

    def close(self) -> None:
        self.stop()


class CountersBackend:
    name = "counters"
    api_version = API_VERSION
    activities = frozenset({"COUNTERS"})
    options = OPTIONS
    in_process = True

    def probe(self) -> Availability:
        try:
            import psutil
        except ImportError:
            return Availability.no("needs psutil: pip install 'polyprof[counters]'")
        return Availability.yes(devices=["host process"], psutil=psutil.__version__)

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> CountersSession:
        return CountersSession(config, ctx)


backend = CountersBackend()
