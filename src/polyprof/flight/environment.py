"""The flight recorder started by the environment, so that unchanged scripts and every rank of a
``torchrun`` job get one::

    POLYPROF_FLIGHT_RECORDER=30 torchrun --nproc-per-node 4 train.py
    POLYPROF_FLIGHT_RECORDER="30,hang_s=120,slow_step=off,max_captures=10" python train.py
    polyprof run --flight-recorder 30 --flight-recorder-option hang_s=120 train.py

The value is the seconds kept (``on``: 30), then any of the recorder's settings as ``NAME=VALUE``
(``_polyprof_startup.FLIGHT_SETTINGS`` lists them; ``docs/flight-recorder.md`` has the table);
``POLYPROF_FLIGHT_DIR`` (default ``flight``) and ``POLYPROF_FLIGHT_OPS`` (``top``, ``all``, ``none``)
still set the folder and the operators. The start-up hook arms it when ``import torch`` completes
(:mod:`polyprof.startup`); ``polyprof run --flight-recorder`` calls :func:`start_from_environment`.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import _polyprof_startup as variables
from polyprof.errors import ConfigError

VARIABLE, FOLDER, OPS = variables.FLIGHT, variables.FLIGHT_DIR, variables.FLIGHT_OPS
DEFAULT_SECONDS = 30.0


def settings_from(text: str, options: tuple[str, ...] = (), source: str = VARIABLE) -> dict[str, Any] | None:
    """The recorder's settings from POLYPROF_FLIGHT_RECORDER's value and `options` (``NAME=VALUE``
    each, later ones win); None where the value says off. A ConfigError names what is wrong."""
    try:
        settings = variables.flight_settings(text, source)
        if settings is None:
            return None
        for option in options:
            settings.update(variables.flight_setting(option, "--flight-recorder-option"))
    except variables.BadSetting as exc:
        raise ConfigError(str(exc)) from None
    return settings


def start_from_environment(options: tuple[str, ...] = (), **overrides: Any) -> Any:
    """Start the flight recorder the environment asks for (None when it asks for none; the one already
    running in this process, if any); it stops when the interpreter exits."""
    from polyprof.flight.recorder import FlightRecorder, running

    settings = settings_from(os.environ.get(VARIABLE, ""), options)
    if settings is None:
        return None
    if running() is not None:
        return running()
    seconds = float(settings.pop("seconds", DEFAULT_SECONDS))  # type: ignore[arg-type]
    defaults = {"out_dir": os.environ.get(FOLDER) or "flight", "ops": os.environ.get(OPS) or "top"}
    recorder = FlightRecorder(seconds, **{**defaults, **settings, **overrides}).start()
    atexit.register(recorder.stop, wait=False)
    return recorder
