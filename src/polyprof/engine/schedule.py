"""``torch.profiler.schedule`` semantics: the step formula, the actions, and the transition table."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any

from polyprof.errors import ConfigError


class ProfilerAction(Enum):
    """What the profiler does at a step (same members and values as torch.profiler.ProfilerAction).

    A member equals torch's member of the same value (``ProfilerAction.RECORD ==
    torch.profiler.ProfilerAction.RECORD``), so schedules and tests written for either mix freely.
    DEVICE_STOPPED is torch's internal state for device collection that stopped early; polyprof never
    enters it, and a schedule that returns it is an error, as in torch.
    """

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3
    DEVICE_STOPPED = 4

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum) and type(other).__name__ == "ProfilerAction":
            return self.value == other.value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)


def schedule(
    *, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0, skip_first_wait: int = 0
) -> Callable[[int], ProfilerAction]:
    """The step -> action function of ``torch.profiler.schedule`` (same formula and warnings).

    Invalid values raise :class:`polyprof.errors.ConfigError` (a ValueError) before anything starts.
    """
    for label, value, minimum in (
        ("wait", wait, 0),
        ("warmup", warmup, 0),
        ("active", active, 1),
        ("repeat", repeat, 0),
        ("skip_first", skip_first, 0),
        ("skip_first_wait", skip_first_wait, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(
                f"schedule(): {label} must be an integer >= {minimum}, got {value!r}"
                + (" (active is the number of recorded steps per cycle)" if label == "active" else "")
            )
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results", stacklevel=2)

    def schedule_fn(step: int) -> ProfilerAction:
        assert step >= 0
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait != 0:
            step += wait
        num_steps = wait + warmup + active
        if repeat > 0 and step / num_steps >= repeat:
            return ProfilerAction.NONE
        mod_step = step % num_steps
        if mod_step < wait:
            return ProfilerAction.NONE
        if mod_step < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if mod_step < num_steps - 1 else ProfilerAction.RECORD_AND_SAVE

    return schedule_fn


def always_record(_: int) -> ProfilerAction:
    """The schedule used when none is given: record from start to stop."""
    return ProfilerAction.RECORD


# Phase names used by the transition table.
PREPARE, START, STOP, READY, WARN = "prepare", "start", "stop", "ready", "warn"

_A = ProfilerAction
#: (previous action, current action) -> phases, exactly torch.profiler's table. `None` is "exit".
TRANSITIONS: dict[tuple[ProfilerAction, ProfilerAction | None], tuple[str, ...]] = {
    (_A.NONE, _A.NONE): (),
    (_A.NONE, _A.WARMUP): (PREPARE,),
    (_A.NONE, _A.RECORD): (PREPARE, START),
    (_A.NONE, _A.RECORD_AND_SAVE): (PREPARE, START),
    (_A.WARMUP, _A.NONE): (WARN, START, STOP),
    (_A.WARMUP, _A.WARMUP): (),
    (_A.WARMUP, _A.RECORD): (START,),
    (_A.WARMUP, _A.RECORD_AND_SAVE): (START,),
    (_A.RECORD, _A.NONE): (WARN, STOP),
    (_A.RECORD, _A.WARMUP): (WARN, STOP),
    (_A.RECORD, _A.RECORD): (),
    (_A.RECORD, _A.RECORD_AND_SAVE): (),
    (_A.RECORD_AND_SAVE, _A.NONE): (STOP, READY),
    (_A.RECORD_AND_SAVE, _A.WARMUP): (STOP, READY, PREPARE),
    (_A.RECORD_AND_SAVE, _A.RECORD): (STOP, READY, PREPARE, START),
    (_A.RECORD_AND_SAVE, _A.RECORD_AND_SAVE): (STOP, READY, PREPARE, START),
    (_A.NONE, None): (),
    (_A.WARMUP, None): (START, STOP),
    (_A.RECORD, None): (STOP, READY),
    (_A.RECORD_AND_SAVE, None): (STOP, READY),
}


def as_action(value: Any) -> ProfilerAction:
    """polyprof's ProfilerAction for polyprof's, torch's (same values) or a bare value."""
    return value if isinstance(value, ProfilerAction) else ProfilerAction(getattr(value, "value", value))


def phases_between(prev: Any, cur: Any) -> tuple[ProfilerAction, tuple[str, ...], str]:
    """The schedule's move from `prev` to `cur` (None: the profile ends): the action now current, the
    phases to run and the move in words (for torch's "Incorrect schedule" warning). A schedule may not
    return DEVICE_STOPPED (torch's rule)."""
    before = as_action(prev)
    after = None if cur is None else as_action(cur)
    if after is ProfilerAction.DEVICE_STOPPED:
        raise ConfigError(
            "ProfilerAction.DEVICE_STOPPED is set internally by the profiler and must not be returned by "
            "a user-provided schedule"
        )
    words = f"{before.name} followed by {after.name}" if after is not None else ""
    return after or ProfilerAction.NONE, TRANSITIONS[(before, after)], words
