"""The engine: runs one profile across backend sessions.

- :mod:`.selection`: which backends a profile runs (probing, options);
- :mod:`.sessions`: the set of guarded sessions of one recording window;
- :mod:`.scheduled`: the schedule-driven profile (the user's object);
- :mod:`.background`: merge and write off the training thread;
- :mod:`.merge`: the columnar merge of what the sessions handed over;
- :mod:`.schedule`, :mod:`.guard`: the schedule state machine, time-limited guarded calls.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DEFAULT_CALL_TIMEOUT_S": "polyprof.engine.sessions",
    "Profile": "polyprof.engine.scheduled",
    "profile": "polyprof.engine.scheduled",
    "ProfilerAction": "polyprof.engine.schedule",
}
# (the schedule function is polyprof.engine.schedule.schedule: its module has its name)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'polyprof.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = list(_LAZY)
