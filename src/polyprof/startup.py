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
        try:
            from polyprof.ondemand.listener import listen

            listen()
        except Exception as exc:
            print(f"polyprof: POLYPROF_ON_DEMAND is set but this process cannot be made capturable: {exc}",
                  file=sys.stderr)  # fmt: skip
    if _on("POLYPROF_FLIGHT_RECORDER"):
        try:
            from polyprof.flight.environment import start_from_environment

            start_from_environment()
        except Exception as exc:
            print(f"polyprof: POLYPROF_FLIGHT_RECORDER is set but the flight recorder cannot start: {exc}",
                  file=sys.stderr)  # fmt: skip


_start()
