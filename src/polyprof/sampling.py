"""Counters sampled on a thread of their own while a profile records, for backends that read numbers
(process counters, a GPU vendor's management library) rather than events::

    sampler = CounterSampler("polyprof-nvml", interval_s=0.1, read=read_all)   # read() -> [(source, track, value)]
    sampler.start()      # in the session's start()
    sampler.stop()       # in stop(): the thread ends
    for source, ts, track, value in sampler.take(): sink.counter(track, value, ts=ts, device=...)

`read` runs every `interval_s`; what it raises is counted (the first error kept in `first_error`) and
sampling goes on. A track named in `rates` is read as a running total and written as its rate per
second since the previous sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from polyprof.clock import host_ns

Sample = tuple[Hashable, str, float]  # (source: a device index, "host"...; track name; value)


class CounterSampler:
    def __init__(self, thread_name: str, interval_s: float, read: Callable[[], Iterable[Sample]],
                 rates: Iterable[str] = ()) -> None:  # fmt: skip
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

    def take(self) -> list[tuple[Hashable, int, str, float]]:
        samples, self.samples = self.samples, []
        return samples

    def report(self, reporter: Any) -> None:
        """Tell the backend's status how sampling went (its errors, if any)."""
        if self.errors:
            reporter.warning(f"{self.errors} counter samples failed (first: {self.first_error})")
