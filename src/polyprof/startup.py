"""What polyprof's ``polyprof-startup.pth`` runs as the interpreter starts, when one of its variables
is set (unset, the hook costs three environment lookups and imports nothing):

* ``POLYPROF_ACTIVITIES`` (e.g. ``+opencl,+counters``): checked now; a group no installed backend
  serves ends the program before it starts (exit status 2), with the installed groups listed;
* ``POLYPROF_TORCH_PROFILER=1``: polyprof goes behind ``torch.profiler`` as soon as torch is imported
  (:mod:`polyprof.profiler.behind_torch`);
* ``POLYPROF_ON_DEMAND=1``: the process listens for captures (:mod:`polyprof.ondemand`);
* ``POLYPROF_FLIGHT_RECORDER=SECONDS``: the flight recorder runs (:mod:`polyprof.flight.environment`).

The variables reach what the program starts (``torchrun`` workers, Ray workers, subprocesses), each of
which runs the same hook. Any other failure is said on stderr and never stops the program.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def _on(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def _start() -> None:
    if os.environ.get("POLYPROF_ACTIVITIES", "").strip():
        from polyprof.errors import ConfigError
        from polyprof.profiler.settings import activity_edits

        try:
            activity_edits()
        except ConfigError as exc:
            print(f"polyprof: {exc}", file=sys.stderr, flush=True)
            os._exit(2)  # (SystemExit inside site's start-up is a fatal error with a traceback)
    if _on("POLYPROF_TORCH_PROFILER"):
        from polyprof.profiler.behind_torch import install_when_torch_is_imported

        install_when_torch_is_imported()
    if _on("POLYPROF_ON_DEMAND"):
        _said_if_it_fails("POLYPROF_ON_DEMAND", "this process cannot be made capturable", _listen)
    if _on("POLYPROF_FLIGHT_RECORDER"):
        _said_if_it_fails("POLYPROF_FLIGHT_RECORDER", "the flight recorder cannot start", _flight_recorder)


def _listen() -> None:
    from polyprof.ondemand.listener import listen

    listen()


def _flight_recorder() -> None:
    from polyprof.flight.environment import start_from_environment

    start_from_environment()


def _said_if_it_fails(variable: str, what: str, start: Callable[[], None]) -> None:
    """`start()`; a failure is said on stderr (the program runs on without it)."""
    try:
        start()
    except Exception as exc:
        print(f"polyprof: {variable} is set but {what}: {exc}", file=sys.stderr)


_start()
