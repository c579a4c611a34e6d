"""Size controls for large captures: what a trace keeps, chosen by the user and counted, never silent.

::

    limits = Limits(min_host_span_ns=2_000, include=("aten::*", "step*"), exclude=("aten::empty*",),
                    exclude_kinds=("cpu_instant_event",), max_events_per_backend=2_000_000)
    polyprof.profile(limits=limits)              # or a dict of the same keys
    polyprof run --min-span-us 2 --include 'aten::*' --max-events 2000000 train.py

Every row a limit drops is counted on its backend's status (``dropped``, under the limit's name), so
the trace says what it does not hold. Name patterns are shell globs (``fnmatch``), matched once per
distinct name.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from polyprof.errors import ConfigError
from polyprof.model import HOST_DEVICE_KEY, ActivityKind, CollectedPart
from polyprof.model.kinds import DEFAULT_CATEGORY

SHORT = "host span shorter than min_host_span_ns"
NAMED = "name left out (include/exclude)"
KIND = "kind left out (exclude_kinds)"
CAPPED = "over max_events_per_backend"
DROP_REASONS = (SHORT, NAMED, KIND, CAPPED)


def _kind(value: Any) -> int:
    """An ActivityKind from a member, its name (``KERNEL``, ``kernel``) or its trace category."""
    if isinstance(value, ActivityKind):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in ActivityKind._value2member_map_:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ActivityKind.__members__:
            return int(ActivityKind[text.upper()])
        for kind, category in DEFAULT_CATEGORY.items():
            if category == text.lower():
                return int(kind)
    names = ", ".join(k.name.lower() for k in ActivityKind)
    raise ConfigError(f"exclude_kinds: {value!r} is not an activity kind; use one of {names}")


@dataclass(frozen=True)
class Limits:
    """See the module docstring. All limits are off by default."""

    min_host_span_ns: int = 0  # host spans (not instants) shorter than this are dropped
    include: tuple[str, ...] = ()  # name globs: when given, only rows whose name matches one are kept
    exclude: tuple[str, ...] = ()  # name globs: rows whose name matches one are dropped
    exclude_kinds: frozenset[int] = field(default_factory=frozenset)
    max_events_per_backend: int | None = None  # each backend keeps its earliest this many rows

    @classmethod
    def of(cls, value: Limits | Mapping[str, Any] | None) -> Limits | None:
        """`value` checked: a Limits, a dict of its fields, or None (no limits)."""
        if value is None or isinstance(value, Limits):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"limits must be polyprof.Limits or a dict of its fields, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"unknown limit(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}")
        return cls(**value)

    def __post_init__(self) -> None:
        span = self.min_host_span_ns
        if isinstance(span, bool) or not isinstance(span, (int, float)) or not math.isfinite(span) or span < 0:
            raise ConfigError(f"min_host_span_ns must be a number of ns >= 0, got {span!r}")
        object.__setattr__(self, "min_host_span_ns", int(span))
        for name in ("include", "exclude"):
            patterns = getattr(self, name)
            patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
            if not all(isinstance(p, str) and p for p in patterns):
                raise ConfigError(f"{name} takes name patterns (non-empty strings), got {patterns!r}")
            object.__setattr__(self, name, patterns)
        kinds = self.exclude_kinds
        object.__setattr__(self, "exclude_kinds", frozenset(_kind(k) for k in ([kinds] if isinstance(kinds, str) else kinds)))
        cap = self.max_events_per_backend
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ConfigError(f"max_events_per_backend must be a whole number >= 0 or None, got {cap!r}")

    def keep(self, part: CollectedPart, kept: np.ndarray, report: Any) -> np.ndarray:
        """`kept` (a row mask of `part`) less the rows these limits drop, each counted in `report` (the
        merge's MergeReport)."""
        acts = part.activities

        def drop(mask: np.ndarray, reason: str) -> np.ndarray:
            gone = kept & ~mask
            if gone.any():
                report.drop(part.backend, reason, int(gone.sum()))
            return kept & mask

        if self.exclude_kinds:
            kept = drop(~np.isin(acts["kind"], sorted(self.exclude_kinds)), KIND)
        if self.include or self.exclude:
            strings = acts.strings.strings
            wanted = np.array([self._wanted(s) for s in strings] or [True], dtype=bool)
            kept = drop(wanted[acts["name"]], NAMED)
        if self.min_host_span_ns:
            host = [i for i, d in enumerate(part.devices) if d.key == HOST_DEVICE_KEY]
            on_host = np.isin(acts["device"], host) & (acts["kind"] != int(ActivityKind.INSTANT))
            short = on_host & (acts["end"] - acts["start"] < self.min_host_span_ns)
            kept = drop(~short, SHORT)
        return kept

    def _wanted(self, name: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)


def cap_per_backend(parts: Sequence[CollectedPart], keeps: list[np.ndarray | None], cap: int, report: Any) -> None:
    """Keep, of each backend's rows over all its parts, the earliest `cap` (by start); the rest are
    counted in `report`. `keeps` (per part: kept row indices, None for all) is updated in place."""
    by_backend: dict[str, list[int]] = {}
    for i, part in enumerate(parts):
        by_backend.setdefault(part.backend, []).append(i)
    for indices in by_backend.values():
        rows = [np.arange(len(parts[i].activities)) if keeps[i] is None else keeps[i] for i in indices]
        total = sum(len(r) for r in rows)
        if total <= cap:
            continue
        starts = np.concatenate([parts[i].activities["start"][r] for i, r in zip(indices, rows, strict=True)])
        order = np.argsort(starts, kind="stable")[:cap]
        chosen = np.zeros(total, dtype=bool)
        chosen[order] = True
        at = 0
        for i, r in zip(indices, rows, strict=True):
            mine = chosen[at : at + len(r)]
            keeps[i] = r[mine]
            at += len(r)
        report.drop(parts[indices[0]].backend, CAPPED, total - cap)


def limits_from_cli(min_span_us: float | None, include: Iterable[str], exclude: Iterable[str], exclude_kind: Iterable[str],
                    max_events: int | None) -> Limits | None:
    """The Limits of `polyprof run`'s options (None when none is given)."""
    if min_span_us is None and not include and not exclude and not exclude_kind and max_events is None:
        return None
    if min_span_us is not None and not (math.isfinite(min_span_us) and min_span_us >= 0):
        raise ConfigError(f"--min-span-us must be a finite number >= 0, got {min_span_us}")
    return Limits(
        min_host_span_ns=round((min_span_us or 0) * 1000),
        include=tuple(include),
        exclude=tuple(exclude),
        exclude_kinds=frozenset(_kind(k) for k in exclude_kind),
        max_events_per_backend=max_events,
    )
