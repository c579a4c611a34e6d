"""Helpers for counter samplers: a thread that samples while a profile records (:class:`CounterSampler`),
a session over a vendor library's per-GPU counters (:class:`DeviceCounterSession`), and the backend half
every counter backend shares (:class:`CounterBackend`, with its ``interval_ms`` option).

::

    from polyprof.plugin.counters import CounterBackend, DeviceCounterSession

    class VendorSession(DeviceCounterSession):
        ...

    class VendorBackend(CounterBackend):
        name, activities, session_class = "vendor", frozenset({"VENDOR"}), VendorSession
        def probe(self): ...
"""

from polyprof.plugin.sampling import SAMPLING_OPTIONS, CounterBackend, CounterSampler, DeviceCounterSession

__all__ = ["SAMPLING_OPTIONS", "CounterBackend", "CounterSampler", "DeviceCounterSession"]
