"""The flight recorder: always on, the last seconds written when a step is slow, the job hangs, the
process fails or is signalled. See :mod:`polyprof.flight.recorder`.

::

    recorder = polyprof.flight_recorder(seconds=30, out_dir="flight")
"""

from polyprof.flight.recorder import FLIGHT_KEY, FlightRecorder, flight_recorder

__all__ = ["FLIGHT_KEY", "FlightRecorder", "flight_recorder"]
