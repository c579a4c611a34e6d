"""The engine: runs one profile across backend sessions.

- :mod:`.selection`: which backends a profile runs (probing, options);
- :mod:`.sessions`: the set of guarded sessions of one recording window;
- :mod:`.scheduled`: the schedule-driven profile (the user's object), its :mod:`.profile_options`;
- :mod:`.window`: one recording window (sessions, collect, merge into a Trace), its :mod:`.listeners`
  (spill, ring), :mod:`.pauses` and the handler's :mod:`.window_view`;
- :mod:`.exclusive`: one recording profile per process;
- :mod:`.background`: merge and write off the training thread;
- :mod:`.merge`: the columnar merge of what the sessions handed over;
- :mod:`.schedule`, :mod:`.guard`: the schedule state machine, time-limited guarded calls.
"""

from __future__ import annotations

from polyprof._lazy import lazy_names

_LAZY = {
    "DEFAULT_CALL_TIMEOUT_S": "polyprof.engine.sessions",
    "Profile": "polyprof.engine.scheduled",
    "ProfileOptions": "polyprof.engine.profile_options",
    "profile": "polyprof.engine.scheduled",
    "ProfilerAction": "polyprof.engine.schedule",
}
# (the schedule function is polyprof.engine.schedule.schedule: its module has its name)


__getattr__, __dir__ = lazy_names(globals(), _LAZY)

__all__ = list(_LAZY)
