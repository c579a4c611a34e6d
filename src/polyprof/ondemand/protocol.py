"""The requests a capturable process accepts, checked strictly before anything is done with them.

::

    {"op": "status"}
    {"op": "capture", "output": "/abs/trace.json.gz", "steps": 3}            # or "duration_s": 5.0
    {"op": "capture", ..., "activities": ["cpu"], "job": true, "timeout_s": 120}
    {"op": "capture", "output": "/abs/last.pftrace", "last_s": 30}          # the flight recorder's last 30 s

Every reply is one JSON line: ``{"ok": true, ...}`` or ``{"ok": false, "error": "what was wrong"}``.
A capture gets two: ``{"ok": true, "accepted": {...}}`` at once, ``{"ok": true, "done": {...}}`` when
its trace is written (or ``{"ok": false, ...}`` when it could not be).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MAX_SECONDS = 24 * 3600.0
MAX_STEPS = 100_000
MAX_PATH = 4096
DEFAULT_TIMEOUT_S = 60.0  # a steps capture waits this long for its first step (a job: for its ranks)


class RequestError(ValueError):
    """A request that is not one of the above; the message says what is wrong."""


@dataclass(frozen=True)
class CaptureRequest:
    output: str
    duration_s: float | None = None
    steps: int | None = None
    activities: tuple[str, ...] | None = None
    job: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    last_s: float | None = None  # the flight recorder's last seconds, written now (nothing recorded anew)

    def describe(self) -> dict[str, Any]:
        how = ({"steps": self.steps} if self.steps is not None else
               {"last_s": self.last_s} if self.last_s is not None else {"duration_s": self.duration_s})
        return {**how, "output": self.output, "activities": list(self.activities or []) or "all", "job": self.job}


@dataclass(frozen=True)
class StatusRequest:
    extra: dict[str, Any] = field(default_factory=dict)


_CAPTURE_KEYS = {"op", "output", "duration_s", "steps", "activities", "job", "timeout_s", "last_s"}


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 < value <= MAX_SECONDS:
        raise RequestError(f"{name} must be more than 0 and at most {MAX_SECONDS:.0f} s, got {value}")
    return float(value)


def parse_request(message: Any) -> CaptureRequest | StatusRequest:
    """The request in `message` (already parsed JSON); RequestError when it is not a valid one."""
    if not isinstance(message, dict):
        raise RequestError(f"a request is a JSON object, got {type(message).__name__}")
    op = message.get("op")
    if op == "status":
        if set(message) != {"op"}:
            raise RequestError(f"status takes no fields, got {sorted(k for k in message if k != 'op')}")
        return StatusRequest()
    if op != "capture":
        raise RequestError(f'unknown op {op!r}: "status" or "capture"')
    unknown = set(message) - _CAPTURE_KEYS
    if unknown:
        raise RequestError(f"unknown fields {sorted(map(str, unknown))}; a capture takes {sorted(_CAPTURE_KEYS - {'op'})}")
    empty = sorted(k for k, v in message.items() if v is None)
    if empty:
        raise RequestError(f"{', '.join(empty)}: null is not a value; leave the field out")
    output = message.get("output")
    if not isinstance(output, str) or not output.startswith("/") or len(output) > MAX_PATH or "\0" in output:
        raise RequestError("output must be an absolute path (a string starting with /, at most 4096 characters)")
    duration, steps, last = message.get("duration_s"), message.get("steps"), message.get("last_s")
    if sum(v is not None for v in (duration, steps, last)) != 1:
        raise RequestError("a capture needs exactly one of duration_s, steps and last_s")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS):
        raise RequestError(f"steps must be a whole number from 1 to {MAX_STEPS}, got {steps!r}")
    activities = message.get("activities")
    if activities is not None:
        if not isinstance(activities, list) or not 0 < len(activities) <= 32 or not all(
            isinstance(a, str) and 0 < len(a) <= 64 for a in activities
        ):
            raise RequestError("activities must be a list of 1 to 32 group names (strings), e.g. [\"cpu\"]; leave it out for all")
    job = message.get("job", False)
    if not isinstance(job, bool):
        raise RequestError(f"job must be true or false, got {job!r}")
    return CaptureRequest(
        output=output,
        duration_s=None if duration is None else _seconds(duration, "duration_s"),
        steps=steps,
        activities=tuple(activities) if activities is not None else None,
        job=job,
        timeout_s=_seconds(message.get("timeout_s", DEFAULT_TIMEOUT_S), "timeout_s"),
        last_s=None if last is None else _seconds(last, "last_s"),
    )


def error_reply(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}
