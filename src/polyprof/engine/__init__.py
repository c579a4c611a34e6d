"""The engine: runs one profile across backend sessions (schedule, lifecycle, fault isolation)."""

from polyprof.engine.lifecycle import DEFAULT_CALL_TIMEOUT_S, PolyprofWarning, Profile, profile
from polyprof.engine.schedule import ProfilerAction, schedule

__all__ = ["DEFAULT_CALL_TIMEOUT_S", "PolyprofWarning", "Profile", "ProfilerAction", "profile", "schedule"]
