"""The flight recorder started by the environment, so that unchanged scripts and every rank of a
``torchrun`` job get one: ``POLYPROF_FLIGHT_RECORDER=SECONDS`` (``1``/``on``: 30 s) and, optionally,
``POLYPROF_FLIGHT_DIR`` (default ``flight``) and ``POLYPROF_FLIGHT_OPS`` (``top``, ``all``, ``none``).
The start-up hook (:mod:`polyprof.startup`) and ``polyprof run --flight-recorder`` call
:func:`start_from_environment`.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from polyprof.errors import ConfigError

VARIABLE, FOLDER, OPS = "POLYPROF_FLIGHT_RECORDER", "POLYPROF_FLIGHT_DIR", "POLYPROF_FLIGHT_OPS"
DEFAULT_SECONDS = 30.0


def seconds_from(text: str) -> float:
    """POLYPROF_FLIGHT_RECORDER's value as seconds (a ConfigError naming it when it is not one)."""
    value = text.strip().lower()
    if value in ("on", "true", "yes"):
        return DEFAULT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{VARIABLE}={text!r}: give the seconds to keep (e.g. 30), or on") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(f"{VARIABLE}={text!r}: give a positive number of seconds (e.g. 30)")
    return seconds


def start_from_environment(**overrides: Any) -> Any:
    """Start the flight recorder the environment asks for (None when it asks for none); it stops when
    the interpreter exits."""
    from polyprof.flight.recorder import FlightRecorder

    text = os.environ.get(VARIABLE, "")
    if text.strip() in ("", "0"):
        return None
    options = {"out_dir": os.environ.get(FOLDER) or "flight", "ops": os.environ.get(OPS) or "top", **overrides}
    recorder = FlightRecorder(seconds_from(text), **options).start()
    atexit.register(recorder.stop, wait=False)
    return recorder
