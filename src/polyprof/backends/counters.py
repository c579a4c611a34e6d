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

from typing import Any

from polyprof.plugin.backend import Availability, ProfileConfig, SessionContext
from polyprof.plugin.sampling import CounterBackend, CounterSampler, sampling_interval_s
from polyprof.plugin.sink import Sink
from polyprof.plugin.traits import SessionTraits

THREAD_NAME = "polyprof-counters"
MB = 1 << 20
RATES = ("process read (MB/s)", "process write (MB/s)")  # read as totals, written as rates


class ProcessCounters:
    """What one sample reads (psutil); the I/O counters are running totals, turned into rates."""

    def __init__(self, psutil: Any) -> None:
        self.psutil = psutil
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call starts the measurement
        psutil.cpu_percent(None)
        self.io = True

    def read(self) -> list[tuple[str, str, float]]:
        p = self.process
        with p.oneshot():
            values = [("host", "process cpu %", p.cpu_percent(None)), ("host", "process rss (MB)", p.memory_info().rss / MB),
                      ("host", "process threads", float(p.num_threads()))]
        if self.io:
            try:
                c = p.io_counters()
                values += [("host", "process read (MB/s)", c.read_bytes / MB), ("host", "process write (MB/s)", c.write_bytes / MB)]
            except (AttributeError, OSError, self.psutil.Error):
                self.io = False  # not counted here (macOS, some containers)
        values += [("host", "system cpu %", self.psutil.cpu_percent(None)),
                   ("host", "system memory used %", self.psutil.virtual_memory().percent)]
        return values


class CountersSession:
    traits = SessionTraits(in_process=True)  # polyprof's own: called directly, not on a guard thread

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.interval_s = sampling_interval_s(ctx.options)
        self.sampler: CounterSampler | None = None

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        import psutil

        self.sampler = CounterSampler(THREAD_NAME, self.interval_s, ProcessCounters(psutil).read, rates=RATES)
        self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def collect(self, sink: Sink) -> None:
        if self.sampler is None:
            return
        samples = self.sampler.take(self.ctx.window_end)
        for _source, ts, track, value in samples:
            sink.counter(track, value, ts=ts)
        self.ctx.report.detail("samples", len({ts for _, ts, _, _ in samples}))
        self.sampler.report(self.ctx.report)

    def close(self) -> None:
        self.stop()


class CountersBackend(CounterBackend):
    name, activities, session_class = "counters", frozenset({"COUNTERS"}), CountersSession

    def probe(self) -> Availability:
        try:
            import psutil
        except ImportError:
            return Availability.no("needs psutil: pip install 'polyprof[counters]'")
        return Availability.yes(devices=["host process"], psutil=psutil.__version__)



backend = CountersBackend()
