"""What the start-up hook (:mod:`_polyprof_startup`, run by ``polyprof-startup.pth``) arms once the
program needs it: when ``import torch`` completes, or (``POLYPROF_ON_DEMAND=1`` alone) when a script or
module starts. Each feature arms once per process, whichever comes first; a failure is one line on
stderr and the program runs on without that feature::

    POLYPROF_FLIGHT_RECORDER="30,hang_s=120" torchrun --nproc-per-node 4 train.py
    # each rank: at `import torch`, the configuration checked, then the recorder started

* the configuration (``POLYPROF_ACTIVITIES``, ``polyprof.toml``, ``[tool.polyprof]``) is checked first,
  whole: a mistake is one warning line now, and the clean error where a profile is made;
* ``POLYPROF_TORCH_PROFILER=1``: polyprof goes behind ``torch.profiler``
  (:mod:`polyprof.profiler.behind_torch`);
* ``POLYPROF_ON_DEMAND=1``: the process listens for captures (:mod:`polyprof.ondemand`);
* ``POLYPROF_FLIGHT_RECORDER=SPEC``: the flight recorder runs (:mod:`polyprof.flight.environment`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import _polyprof_startup as variables
from polyprof.torch.import_hook import import_completed

_armed: set[str] = set()


def arm(when: str) -> None:
    """Arm what the variables ask for and is not armed yet; `when` is what the program just did
    ("import torch", "program start")."""
    found = variables.wanted(say=False)  # (a bad value was said as the interpreter started)
    torch_ready = when == "import torch" or import_completed("torch")  # (torch's import is on the stack then)
    if "configuration" not in _armed and torch_ready:
        _armed.add("configuration")
        _said_if_it_fails("the configuration", "profiles made in this process will refuse it", _check_configuration)
    if found["torch_profiler"] and torch_ready:
        _once("torch_profiler", variables.TORCH_PROFILER, "torch.profiler could not be switched to polyprof",
              _behind_torch_profiler)
    if found["on_demand"]:
        _once("on_demand", variables.ON_DEMAND, "this process cannot be made capturable", _listen)
    if found["flight"] and torch_ready:
        _once("flight", variables.FLIGHT, "the flight recorder cannot start", _flight_recorder)


def _once(key: str, variable: str, what: str, start: Callable[[], None]) -> None:
    if key in _armed:
        return
    _armed.add(key)
    _said_if_it_fails(variable, what, start)


def _check_configuration() -> None:
    from polyprof.profiler.settings import activity_edits

    activity_edits(lenient=True)  # said once here, at torch's import, never again mid-run


def _behind_torch_profiler() -> None:
    from polyprof.profiler.behind_torch import install_torch_profiler

    install_torch_profiler()


def _listen() -> None:
    from polyprof.ondemand.listener import listen

    listen()


def _flight_recorder() -> None:
    from polyprof.flight.environment import start_from_environment

    start_from_environment()


def _said_if_it_fails(source: str, what: str, start: Callable[[], None]) -> None:
    """`start()`; a failure is one line on stderr (the program runs on without it)."""
    try:
        start()
    except Exception as exc:  # noqa: BLE001 - never into the program
        print(f"polyprof: {source}: {exc} ({what})", file=sys.stderr, flush=True)
