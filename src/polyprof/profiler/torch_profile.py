"""``polyprof.profiler.profile`` where torch is installed: a real ``torch.profiler.profile``.

The class is a subclass of torch.profiler.profile whose lifecycle is torch's own code: ``__enter__``,
``__exit__``, ``start``, ``stop``, ``step`` and ``_transit_action`` are torch's methods, so code written
against torch.profiler sees torch's behaviour (the schedule's transitions and their warnings,
``step_num``, ``ProfilerStep#N`` ranges through torch's ``record_function``, the step tracker), and
``with_stack`` shows the same Python frames as under torch. What a transition does is polyprof's:
``action_map`` maps every (previous, current) action pair to polyprof's phases (prepare the backends,
start and stop recording, hand the window to the background writer, which merges it and calls
``on_trace_ready``); the first transition begins the profile, the one to ``None`` (``stop()``) ends it.

::

    import torch.profiler
    from polyprof.profiler import profile

    p = profile(activities=["cpu", "opencl"])
    assert isinstance(p, torch.profiler.profile)
"""

from __future__ import annotations

import functools
from typing import Any

from polyprof.engine.schedule import TRANSITIONS, ProfilerAction, as_action

#: torch.profiler.profile's methods the subclass runs as they are
TORCH_LIFECYCLE = ("__enter__", "__exit__", "start", "stop", "step", "_transit_action")


class ActionMap(dict):
    """torch's ``action_map`` with polyprof's transitions: (previous, current) -> [one callable], keyed by
    polyprof's ProfilerAction and looked up with torch's members too (a schedule may return either)."""

    def __init__(self, run: Any) -> None:
        super().__init__({key: [functools.partial(run, *key)] for key in TRANSITIONS})

    def get(self, key: Any, default: Any = None) -> Any:
        prev, cur = key
        return super().get((as_action(prev), None if cur is None else as_action(cur)), default)

    def __getitem__(self, key: Any) -> Any:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found


def torch_schedule(polyprof_schedule: Any) -> Any:
    """``schedule(wait=, warmup=, active=, ...)`` with polyprof's formula and checks, whose function
    returns torch's ProfilerAction (frameworks check ``isinstance(action, torch.profiler.ProfilerAction)``)."""
    from torch.profiler import ProfilerAction as TorchAction

    @functools.wraps(polyprof_schedule)
    def schedule(**kwargs: Any) -> Any:
        import warnings

        with warnings.catch_warnings(record=True) as caught:  # said again where the caller is
            warnings.simplefilter("always")
            action_of = polyprof_schedule(**kwargs)
        for w in caught:
            warnings.warn(w.message, w.category, stacklevel=2)

        def schedule_fn(step: int) -> Any:
            return TorchAction(action_of(step).value)

        return schedule_fn

    return schedule


def torch_backed(native: type, torch_profile: type) -> type:
    """The subclass of `torch_profile` (torch.profiler.profile) and `native` (polyprof's front end)."""

    class profile(native, torch_profile):  # type: ignore[valid-type,misc]  # noqa: N801 - torch's name
        __doc__ = native.__doc__
        __module__ = "polyprof.profiler"

        @functools.wraps(native.__init__)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            native.__init__(self, *args, **kwargs)
            first = as_action(self.schedule(self.step_num))
            if first is ProfilerAction.DEVICE_STOPPED:
                raise ValueError(
                    "ProfilerAction.DEVICE_STOPPED is set internally by the profiler and must not be returned "
                    "by a user-provided schedule"
                )
            self.current_action = first  # torch's start() transits NONE -> this
            self._prev_schedule_action = first
            self.step_rec_fn = None
            self.action_map = ActionMap(self._run_transition)
            self.activities = set(self.config.activities)
            self.use_device = None
            self.mem_tl = None
            self.has_cudagraphs = False

        def _run_transition(self, prev: Any, cur: Any) -> None:
            """One transition, as torch's _transit_action calls it: the first begins the profile, one to
            None ends it (waiting for the last window's trace and handler, as torch's stop does)."""
            if cur is None:
                if self._started:
                    self._ending_with_signals(functools.partial(self._end, prev))
                return
            if not self._started:
                self._begin(prev, cur)
                return
            self._between_steps()
            self._transition(prev, cur)
            self._jobs.raise_error()  # after the transition: torch's step() has moved on already

    for name in TORCH_LIFECYCLE:
        setattr(profile, name, getattr(torch_profile, name))
    profile.__qualname__ = "profile"
    return profile
