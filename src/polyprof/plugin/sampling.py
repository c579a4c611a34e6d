"""Counters sampled on a thread of their own while a profile records, for backends that read numbers
(process counters, a GPU vendor's management library) rather than events::

    sampler = CounterSampler("polyprof-counters", interval_s=0.1, read=read_all)   # read() -> [(source, track, value)]
    sampler.start()      # in the session's start()
    sampler.stop()       # in stop(): the thread ends
    for source, ts, track, value in sampler.take(ctx.window_end): sink.counter(track, value, ts=ts, device=...)

`read` runs every `interval_s`; what it raises is counted (the first error kept in `first_error`) and
sampling goes on. A track named in `rates` is read as a running total and written as its rate per
second since the previous sample. :class:`DeviceCounterSession` is a whole backend session on top of it
for a GPU vendor's management library (the device plugins' counter backends).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from polyprof.plugin.backend import API_VERSION
from polyprof.plugin.clock import host_ns
from polyprof.plugin.options import Option, OptionSchema
from polyprof.plugin.traits import BackendTraits, SessionTraits

Sample = tuple[Hashable, str, float]  # (source: a device index, "host"...; track name; value)

#: the options of every sampling backend (``backend_options={name: {"interval_ms": 50}}``)
SAMPLING_OPTIONS = OptionSchema(Option("interval_ms", float, default=100.0, minimum=1, help="time between samples"))


def sampling_interval_s(options: dict[str, Any]) -> float:
    """Seconds between samples, from a session's options (SAMPLING_OPTIONS; 100 ms by default)."""
    return float(options.get("interval_ms") or 100.0) / 1000


class CounterSampler:
    def __init__(self, thread_name: str, interval_s: float, read: Callable[[], Iterable[Sample]],
                 rates: Iterable[str] = ()) -> None:
        self.thread_name = thread_name
        self.interval_s = interval_s
        self.read = read
        self.rates = set(rates)
        self.samples: list[tuple[Hashable, int, str, float]] = []  # (source, ts, track, value)
        self.errors = 0
        self.first_error = ""
        self._last: dict[tuple[Hashable, str], tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def sample_once(self) -> None:
        now = host_ns()
        try:
            values = list(self.read())
        except Exception as exc:  # never the program's problem: counted, said once
            self.errors += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"
            return
        for source, track, value in values:
            if track in self.rates:  # a running total: the rate since the last sample
                before = self._last.get((source, track))
                self._last[(source, track)] = (now, value)
                if before is None or now <= before[0]:
                    continue
                value = (value - before[1]) / ((now - before[0]) / 1e9)
            self.samples.append((source, now, track, float(value)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def take(self, until: int | None = None) -> list[tuple[Hashable, int, str, float]]:
        """The samples so far, those taken after `until` (the window's end) left out: the thread may take
        one between the window's end and its stop, and the trace keeps no counter past the window."""
        samples, self.samples = self.samples, []
        return samples if until is None else [s for s in samples if s[1] <= until]

    def report(self, reporter: Any) -> None:
        """Tell the backend's status how sampling went (its errors, if any)."""
        if self.errors:
            reporter.warning(f"{self.errors} counter samples failed (first: {self.first_error})")


Read = Callable[[Any], float]


class DeviceCounters:
    """The per-device counters of a vendor's management library: each `(track, read(handle))` of
    `counters` on each `(index, handle)` of `devices`. A read that raises one of `errors` drops that
    counter for that device (it does not support it), named with `why(exc)` in `unsupported`."""

    def __init__(self, devices: list[tuple[int, Any]], counters: Callable[[], list[tuple[str, Read]]],
                 errors: tuple[type[BaseException], ...], why: Callable[[BaseException], str]) -> None:
        self.devices = devices
        self.live = {i: counters() for i, _ in devices}
        self.errors, self.why = errors, why
        self.unsupported: dict[int, list[str]] = {}

    def read(self) -> list[Sample]:
        out: list[Sample] = []
        for i, handle in self.devices:
            for name, read in list(self.live[i]):
                try:
                    out.append((i, name, read(handle)))
                except self.errors as exc:
                    self.live[i].remove((name, read))
                    self.unsupported.setdefault(i, []).append(f"{name}: {self.why(exc)}")
        return out


class DeviceCounterSession:
    """A backend session that samples a vendor library's per-GPU counters while a profile records, as
    counter tracks on each GPU's process. A subclass says how to reach the library::

        class VendorSession(DeviceCounterSession):
            thread_name, device_prefix = "polyprof-vendor", "vendor"
            def open(self): ...           # start the library; [(index, handle, name)] of its GPUs
            def shut(self): ...           # end it (once per open)
            def counters(self): ...       # [(track, read(handle) -> value)]
            errors = (LibError,)          # what a counter a device lacks raises
    """

    traits = SessionTraits(in_process=True)
    thread_name = "polyprof-device-counters"
    device_prefix = "gpu"  # GPU i is the device "<prefix>:i" (the tracing backend's key for it)
    rates: tuple[str, ...] = ()  # tracks read as running totals, written as rates
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, config: Any, ctx: Any) -> None:
        self.ctx = ctx
        self.interval_s = sampling_interval_s(ctx.options)
        self.names: dict[int, str] = {}
        self.reader: DeviceCounters | None = None
        self.sampler: CounterSampler | None = None
        self._open = False

    def open(self) -> list[tuple[int, Any, str]]:
        raise NotImplementedError

    def shut(self) -> None:
        raise NotImplementedError

    def counters(self) -> list[tuple[str, Read]]:
        raise NotImplementedError

    def why(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        gpus = self.open()
        self._open = True
        self.names = {i: name for i, _, name in gpus}
        self.reader = DeviceCounters([(i, h) for i, h, _ in gpus], self.counters, self.errors, self.why)
        self.sampler = CounterSampler(self.thread_name, self.interval_s, self.reader.read, rates=self.rates)
        self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self._open:  # once per open (stop and close both come here)
            self._open = False
            try:
                self.shut()
            except Exception:
                pass

    def collect(self, sink: Any) -> None:
        if self.sampler is None or self.reader is None:
            return
        samples = self.sampler.take(self.ctx.window_end)
        p = self.device_prefix
        devices = {i: sink.device(f"{p}:{i}", type=p, index=i, name=name, pid=i, label=f"GPU {i}")
                   for i, name in self.names.items()}
        for i, ts, track, value in samples:
            sink.counter(track, value, ts=ts, device=devices[i])
        self.ctx.report.detail("samples", len(samples))
        if self.reader.unsupported:
            self.ctx.report.detail("unsupported", {f"GPU {i}": v for i, v in self.reader.unsupported.items()})
        self.sampler.report(self.ctx.report)

    def close(self) -> None:
        self.stop()


class CounterBackend:
    """The backend half every counter backend shares: the contract's version, the ``interval_ms`` option,
    calls made in process, and a session of ``session_class``. A subclass names itself, its groups, its
    session class and its probe::

        class VendorBackend(CounterBackend):
            name, activities, session_class = "vendor", frozenset({"VENDOR"}), VendorSession
            def probe(self) -> Availability: ...
    """

    api_version = API_VERSION
    options = SAMPLING_OPTIONS
    traits = BackendTraits(in_process=True)
    session_class: type

    def create_session(self, config: Any, ctx: Any) -> Any:
        return self.session_class(config, ctx)
