"""One host clock for everything, and the mapping of device clocks onto it.

* :func:`host_ns` is ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux). Every activity in a polyprof
  trace is stamped on it.
* :func:`epoch_offset` pairs it once per trace with the Unix epoch, for output.
* :class:`ClockMapping` maps a device clock onto the host clock from (device_ts, host_ts) pairs::

      pairs = [(dev0, host0), (dev1, host1)]      # taken at start and stop, say
      mapping = ClockMapping.fit([d for d, _ in pairs], [h for _, h in pairs])
      mapping.to_host(device_timestamps)         # int or numpy int64 array
      mapping.residual_ns                        # worst disagreement among the pairs

* :class:`ClockPairs` is what every device backend repeats: sample (device, host) pairs around a device
  clock read, keep the tightest, fit them::

      pairs = ClockPairs()
      pairs.sample(read_device_clock)            # at start; again at stop
      mapping = pairs.fit()                      # ClockMapping, uncertainty = the widest half-bracket
      host_start, host_end = mapping.span_to_host(dev_start, dev_end)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from polyprof._native.shared import host_ns

#: `baseTimeNanoseconds` is the trace's start floored to whole UTC days. Kineto floors to a 3-month
#: grid (output_json.h), which puts relative times near 5e12 us: a double then cannot hold every
#: nanosecond (its spacing there is ~1 ns), and readers that add `ts + dur` (Perfetto) see spans
#: overlap their last child by 1 ns. A day keeps `ts` below ~1.2e11 us, where a double's spacing is
#: 0.02 ns; HTA, Perfetto and torch-tb-profiler all take any base.
BASE_TIME_GRID_NS = 86_400 * 1_000_000_000

#: Any grid has edges: two ranks whose profiles start either side of midnight UTC would get bases a
#: day apart, and readers that ignore the base (HTA, Perfetto, TensorBoard) would show them a day
#: apart. So a job agrees on one base: rank 0 offers the day of its clock an hour back
#: (:func:`job_base_time_ns`; the hour covers ranks that start their profile before rank 0 is reached)
#: and a backend that learns it records it under this key in a clock measurement
#: (``Sink.clock_offset``); the merge then takes it as the trace's base.
JOB_BASE_KEY = "job_base_time_ns"
JOB_BASE_MARGIN_NS = 3_600 * 1_000_000_000
#: how far past a job's base a trace may start and still take it: `ts` stays below 2**41 us, where a
#: double's spacing is under half a nanosecond (beyond, a trace takes its own day)
JOB_BASE_REACH_NS = 24 * BASE_TIME_GRID_NS

@dataclass(frozen=True)
class EpochOffset:
    """``epoch_ns = host_ns + offset_ns``, known to within ``uncertainty_ns``."""

    offset_ns: int
    uncertainty_ns: int


def epoch_offset(samples: int = 7) -> EpochOffset:
    """Pair the host clock with ``time.time_ns`` and keep the tightest of a few brackets."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = host_ns()
        wall = time.time_ns()
        after = host_ns()
        width = after - before
        offset = wall - (before + after) // 2
        if best is None or width < best[1]:
            best = (offset, width)
    assert best is not None
    return EpochOffset(best[0], max(1, best[1] // 2))


def base_time_ns(epoch_ns: int, job_base_ns: int | None = None) -> int:
    """The `baseTimeNanoseconds` of a trace starting at `epoch_ns`: the job's base where one was agreed
    and the trace starts within its reach, else the start's UTC day (see BASE_TIME_GRID_NS).

        base_time_ns(start_epoch_ns)                      # one process: its day
        base_time_ns(start_epoch_ns, job_base_time_ns(t)) # a rank of a job whose rank 0 offered t
    """
    if job_base_ns is not None and 0 <= epoch_ns - job_base_ns < JOB_BASE_REACH_NS:
        return job_base_ns
    return epoch_ns - epoch_ns % BASE_TIME_GRID_NS


def job_base_time_ns(epoch_ns: int) -> int:
    """The base rank 0 offers its job when its clock reads `epoch_ns` (see JOB_BASE_KEY)."""
    return base_time_ns(epoch_ns - JOB_BASE_MARGIN_NS)


def _drift_is_measurable(slope: float, span_ns: float, uncertainty_ns: float) -> bool:
    """Whether a fitted drift is more than the pairs' noise: over the pairs' span it must move the line
    by more than two pairs' uncertainty (each end may be off by one). Two markers 20 ms apart, each
    known to +-100 us on a loaded machine, give "drifts" of +-1 % from noise alone; such a slope
    maps device work far outside its launch window, while an offset-only fit stays within 100 us."""
    return uncertainty_ns <= 0 or abs(slope - 1.0) * span_ns > 2 * uncertainty_ns


@dataclass(frozen=True)
class ClockMapping:
    """``host = host_ref + round(slope * (device - device_ref)) + intercept``.

    Fitted by least squares in coordinates centred on the first pair, so 19-digit timestamps keep
    nanosecond precision. ``slope`` is 1 + drift; ``residual_ns`` is the largest absolute
    disagreement between a pair and the fitted line (0 with fewer than three pairs, when the line
    goes through every pair exactly), ``uncertainty_ns`` what the caller says each pair is worth
    (e.g. half the bracket of a host-timestamped marker).
    """

    device_ref: int = 0
    host_ref: int = 0
    slope: float = 1.0
    intercept: float = 0.0
    residual_ns: float = 0.0
    uncertainty_ns: float = 0.0
    pairs: int = 0

    @classmethod
    def identity(cls) -> ClockMapping:
        return cls()

    @classmethod
    def fit(
        cls,
        device_ts: Any,
        host_ts: Any,
        *,
        fit_drift: bool = True,
        uncertainty_ns: float = 0.0,
    ) -> ClockMapping:
        """Fit from paired samples. One pair (or ``fit_drift=False``) fits an offset only, and so does a
        drift too small for the pairs' ``uncertainty_ns`` to tell from their noise."""
        import numpy as np

        dev = np.asarray(device_ts, dtype=np.int64)
        host = np.asarray(host_ts, dtype=np.int64)
        if dev.shape != host.shape or dev.ndim != 1 or len(dev) == 0:
            raise ValueError("ClockMapping.fit needs two equally long, non-empty 1-D sequences of timestamps")
        d0, h0 = int(dev[0]), int(host[0])
        x = (dev - d0).astype(np.float64)
        y = (host - h0).astype(np.float64)
        slope = 1.0
        if len(dev) > 1 and fit_drift and np.ptp(x) > 0:
            fitted, _ = np.polyfit(x, y, 1)
            if _drift_is_measurable(float(fitted), float(np.ptp(x)), uncertainty_ns):
                slope = float(fitted)
        intercept = float(np.mean(y - slope * x))
        residual = float(np.max(np.abs(y - (slope * x + intercept)))) if len(dev) > 1 else 0.0
        return cls(d0, h0, slope, intercept, residual, float(uncertainty_ns), int(len(dev)))

    @property
    def drift_ppm(self) -> float:
        return (self.slope - 1.0) * 1e6

    @property
    def error_ns(self) -> float:
        """What a mapped timestamp may be off by: the fit residual plus the pairs' own uncertainty."""
        return self.residual_ns + self.uncertainty_ns

    def to_host(self, device_ts: Any) -> Any:
        """Map one device timestamp (int) or an array of them (int64 array) onto the host clock."""
        import numpy as np

        if isinstance(device_ts, (int, np.integer)):
            return self.host_ref + int(
                round(self.slope * (int(device_ts) - self.device_ref) + self.intercept)
            )
        x = (np.asarray(device_ts, dtype=np.int64) - self.device_ref).astype(np.float64)
        return self.host_ref + np.rint(self.slope * x + self.intercept).astype(np.int64)

    def span_to_host(self, start: Any, end: Any) -> tuple[Any, Any]:
        """Device spans (ints or int64 arrays) on the host clock; an end never precedes its start."""
        import numpy as np

        host_start, host_end = self.to_host(start), self.to_host(end)
        if isinstance(host_start, int):
            return host_start, max(host_start, host_end)
        return host_start, np.maximum(host_start, host_end)

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "offset_ns": self.host_ref - self.device_ref + int(round(self.intercept)),
            "drift_ppm": round(self.drift_ppm, 6),
            "residual_ns": round(self.residual_ns, 1),
            "uncertainty_ns": round(self.uncertainty_ns, 1),
        }


@dataclass(frozen=True)
class ClockPair:
    """A device timestamp and the host time it was read at, with half the host bracket around it."""

    device_ns: int
    host_ns: int
    uncertainty_ns: int
    method: str = ""


def sample_clock_pair(read_device: Callable[[], Any], samples: int = 5, method: str = "") -> ClockPair:
    """The tightest of `samples` host brackets around ``read_device()`` (a device clock read). The read
    may return a callable instead, called after the bracket for the timestamp: a marker command enqueued
    inside the bracket and waited for outside it."""
    best: ClockPair | None = None
    for _ in range(max(1, samples)):
        before = host_ns()
        device = read_device()
        after = host_ns()
        device = int(device() if callable(device) else device)
        pair = ClockPair(device, (before + after) // 2, max(1, (after - before) // 2), method)
        if best is None or pair.uncertainty_ns < best.uncertainty_ns:
            best = pair
    assert best is not None
    return best


@dataclass
class ClockPairs:
    """The (device, host) pairs of one device clock over a recording, and their fit."""

    pairs: list[ClockPair] = field(default_factory=list)

    def add(self, pair: ClockPair) -> ClockPair:
        self.pairs.append(pair)
        return pair

    def sample(self, read_device: Callable[[], int], samples: int = 5, method: str = "") -> ClockPair:
        return self.add(sample_clock_pair(read_device, samples, method))

    def clear(self) -> None:
        self.pairs.clear()

    def __len__(self) -> int:
        return len(self.pairs)

    def fit(self, *, fit_drift: bool = True) -> ClockMapping:
        """The mapping through the pairs (identity when there are none)."""
        if not self.pairs:
            return ClockMapping.identity()
        return ClockMapping.fit(
            [p.device_ns for p in self.pairs],
            [p.host_ns for p in self.pairs],
            fit_drift=fit_drift,
            uncertainty_ns=max(p.uncertainty_ns for p in self.pairs),
        )
