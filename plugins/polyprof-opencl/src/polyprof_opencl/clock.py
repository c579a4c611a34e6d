"""Reading an OpenCL device's clock for (device, host) pairs, best method first:

* ``clGetDeviceAndHostTimer`` (OpenCL 2.1, ``Device.device_and_host_timer()``), bracketed by host reads;
* a marker command, whose ``CL_PROFILING_COMMAND_QUEUED`` is stamped while the host enqueues it.

PoCL's CPU device stamps events with CLOCK_MONOTONIC_RAW, so its mapping shows a real offset and a small
drift (NTP slewing), not identity.
"""

from __future__ import annotations

from typing import Any

from polyprof.plugin import ClockPair, sample_clock_pair

_marker_queues: dict[int, Any] = {}  # device pointer -> a private queue, one per process (not per cycle)


class DeviceClock:
    def __init__(self, cl: Any, device: Any) -> None:
        self.cl, self.device = cl, device
        self.error = ""  # why the better method could not be used

    def _marker(self) -> Any:
        """Enqueue a marker (inside the host bracket); its queued time is read after the bracket."""
        key = int(self.device.int_ptr)
        if key not in _marker_queues:
            context = self.cl.Context(devices=[self.device])
            flag = self.cl.command_queue_properties.PROFILING_ENABLE
            _marker_queues[key] = self.cl.CommandQueue(context, properties=flag)
        event = self.cl.enqueue_marker(_marker_queues[key])  # the queue is idle: the last marker was waited for
        return lambda: event.wait() or event.profile.queued

    def sample(self) -> ClockPair:
        if not self.error:
            try:
                return sample_clock_pair(lambda: self.device.device_and_host_timer()[0], method="device_and_host_timer")
            except Exception as exc:  # CL < 2.1, or the platform cannot correlate (INVALID_OPERATION)
                self.error = f"clGetDeviceAndHostTimer unusable ({exc}); using marker commands"
        return sample_clock_pair(self._marker, method="marker")
