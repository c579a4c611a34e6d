"""Errors polyprof raises to users. Each message says what was wrong and how to fix it."""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Iterable


class PolyprofError(Exception):
    """Base class of every error polyprof raises on purpose."""


class ConfigError(PolyprofError, ValueError):
    """A profile's arguments are invalid; raised before anything starts."""


class UnknownNameError(ConfigError):
    """A backend or activity name that no installed backend provides."""

    def __init__(self, what: str, name: str, known: Iterable[str], extra: str = "") -> None:
        known = sorted(set(known))
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5) or difflib.get_close_matches(
            name.upper(), [k.upper() for k in known], n=1, cutoff=0.5
        )
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listing = ", ".join(known) if known else "(none installed)"
        plural = what[:-1] + "ies" if what.endswith("y") else what + "s"
        super().__init__(f"unknown {what} {name!r}.{hint} Known {plural}: {listing}.{extra}")
        self.name = name
        self.known = known


class BackendUnavailableError(PolyprofError, RuntimeError):
    """A profile asked for an activity whose backend cannot run on this machine."""


class ProfilerBusyError(PolyprofError, RuntimeError):
    """A profile started while another records in the process (a RuntimeError, as torch's profiler raises)."""


class BackendConflictError(PolyprofError, RuntimeError):
    """Two installed distributions register a backend under the same name."""


class TraceFormatError(PolyprofError, ValueError):
    """A trace file could not be read: truncated, not JSON, or not a trace."""


class OutputPathError(ConfigError):
    """An output path that cannot be written."""


class BackendContractError(PolyprofError, RuntimeError):
    """A backend used polyprof's contract wrongly (a Sink call it cannot understand, a misspelt column,
    a call after its sink was closed). `backend` names the backend at fault. Inside the engine this
    becomes that backend's error status; it never costs the user the trace."""

    def __init__(self, backend: str, message: str) -> None:
        super().__init__(f"backend {backend!r}: {message}")
        self.backend = backend


class SinkClosedError(BackendContractError):
    """The engine stopped listening to this sink (its collect ran past the time limit, or the rows were
    already handed over)."""


class PolyprofWarning(UserWarning):
    """A backend problem that did not stop the profile (it is also recorded in the trace)."""


_OWN_FILES = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: torch.profiler.profile's lifecycle, which polyprof.profiler.profile runs as it is
_TORCH_LIFECYCLE = os.path.join("torch", "profiler", "profiler.py")


def warn_user(message: str, category: type[Warning] = PolyprofWarning) -> None:
    """``warnings.warn`` pointed at the user's line: the first frame outside polyprof (and outside
    torch.profiler's lifecycle methods, which polyprof's profile runs), however deep the call."""
    frame, level = sys._getframe(1), 2
    while frame is not None and (frame.f_code.co_filename.startswith(_OWN_FILES)
                                 or frame.f_code.co_filename.endswith(_TORCH_LIFECYCLE)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
