"""Pairs of (device timestamp, host timestamp) for mapping an OpenCL device's clock onto polyprof's.

Two methods, best first:

* ``clGetDeviceAndHostTimer`` (OpenCL 2.1, ``Device.device_and_host_timer()``): the device's counter,
  bracketed by two host-clock reads;
* a marker command: ``CL_PROFILING_COMMAND_QUEUED`` is stamped on the device's clock while the host
  enqueues the marker, so the enqueue call brackets it on the host clock.

Each pair carries its half-bracket as uncertainty; several samples are taken and the tightest kept.
PoCL's CPU device stamps events with CLOCK_MONOTONIC_RAW, so its mapping shows a real offset (the
difference from CLOCK_MONOTONIC) and a small drift (NTP slewing), not identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polyprof.plugin import host_ns

SAMPLES = 5
_sampling_queues: dict[int, Any] = {}  # device pointer -> the private queue markers are sampled on


def _sampling_queue(cl: Any, device: Any) -> Any:
    """One private context and profiling queue per device for the whole process: creating them for
    every profile (every schedule cycle) would leave OpenCL a context per cycle to manage."""
    key = int(device.int_ptr)
    queue = _sampling_queues.get(key)
    if queue is None:
        context = cl.Context(devices=[device])
        queue = _sampling_queues[key] = cl.CommandQueue(
            context, properties=cl.command_queue_properties.PROFILING_ENABLE
        )
    return queue


@dataclass(frozen=True)
class ClockPair:
    device_ns: int
    host_ns: int
    uncertainty_ns: int
    method: str


class DeviceClock:
    """Samples one device's clock (markers go to a private queue shared by all profiles)."""

    def __init__(self, cl: Any, device: Any) -> None:
        self.cl = cl
        self.device = device
        self._queue: Any = None
        self.method = "device_and_host_timer"
        self.error = ""

    def _timer_pair(self) -> ClockPair:
        h0 = host_ns()
        device_ts, _platform_host_ts = self.device.device_and_host_timer()
        h1 = host_ns()
        return ClockPair(int(device_ts), (h0 + h1) // 2, max(1, (h1 - h0) // 2), "device_and_host_timer")

    def _marker_pair(self) -> ClockPair:
        cl = self.cl
        if self._queue is None:
            self._queue = _sampling_queue(cl, self.device)
        self._queue.finish()
        h0 = host_ns()
        event = cl.enqueue_marker(self._queue)
        h1 = host_ns()
        event.wait()
        return ClockPair(int(event.profile.queued), (h0 + h1) // 2, max(1, (h1 - h0) // 2), "marker")

    def sample(self, samples: int = SAMPLES) -> ClockPair:
        """The tightest of `samples` pairs."""
        if self.method == "device_and_host_timer":
            try:
                return min((self._timer_pair() for _ in range(samples)), key=lambda p: p.uncertainty_ns)
            except Exception as exc:  # CL < 2.1, or the platform cannot correlate (INVALID_OPERATION)
                self.error = f"clGetDeviceAndHostTimer unusable ({exc}); using marker commands"
                self.method = "marker"
        return min((self._marker_pair() for _ in range(samples)), key=lambda p: p.uncertainty_ns)

    def close(self) -> None:
        self._queue = None
