"""Which backends a profile runs: the activity groups asked for, what probing said, and the options
each backend was given, all checked before anything starts::

    chosen = select_backends(registry, ["cpu", "opencl"])
    options = check_backend_options(chosen, {"opencl": {"devices": [0]}})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from polyprof.engine.registry import ORIGIN_ENV, ORIGIN_EXPLICIT, BackendEntry, Registry
from polyprof.errors import BackendUnavailableError, ConfigError, UnknownNameError, warn_user
from polyprof.plugin.backend import Availability
from polyprof.plugin.traits import backend_traits


def activity_group_name(activity: Any) -> str:
    """'cpu', 'CPU', ProfilerActivity.CPU (polyprof's or torch's) -> 'CPU'."""
    if isinstance(activity, str):
        name = activity
    else:
        name = getattr(activity, "name", None)
        if not isinstance(name, str):
            raise ConfigError(
                f"activities must be names like 'cpu' or ProfilerActivity members, got {activity!r}"
            )
    name = name.strip()
    if not name:
        raise ConfigError("an empty activity name was given")
    return name.upper()


@dataclass(frozen=True)
class Chosen:
    """A backend chosen for a profile, with what probing said."""

    entry: BackendEntry
    availability: Availability

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def groups(self) -> set[str]:
        return {a.upper() for a in self.entry.activities}


@dataclass
class Selection:
    """The backends that run (`selected`), those asked for that cannot (`unavailable`, written to the
    trace with their reasons), and the activity groups of the profile."""

    selected: list[Chosen] = field(default_factory=list)
    unavailable: list[Chosen] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    #: backends named in POLYPROF_BACKENDS or register_backend() that failed to load: warned about at
    #: profile creation and written into the trace as failed, never dropped without a word
    broken: list[BackendEntry] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.selected]

    def serving(self, groups: set[str]) -> list[Chosen]:
        """The selected backends that serve any of `groups`."""
        return [c for c in self.selected if c.groups & groups]

    def warn_left_out(self) -> None:
        """A warning for each backend named in the environment or explicitly that failed to load."""
        for entry in self.broken:
            warn_user(f"polyprof: backend {entry.name or entry.reference!r} ({entry.origin}) is left out: {entry.error}")

    def call_hooks(self, hook: str, *args: Any) -> None:
        """Each backend's optional ``profile_started(config)`` / ``profile_stopped()``: the whole profile,
        every step of a schedule (OpenCL makes queues created at any step profiling-enabled). A failure
        is a warning naming the backend, never the user's exception."""
        from polyprof.engine.guard import describe

        for chosen in self.selected:
            fn = getattr(chosen.entry.backend, hook, None)
            if not callable(fn):
                continue
            try:
                fn(*args)
            except Exception as exc:
                warn_user(f"polyprof backend {chosen.name!r}: {hook}() raised {describe(exc)}")


def select_backends(registry: Registry, activities: Iterable[Any] | None) -> Selection:
    """See :func:`_select`; the guard thread the probes ran on is ended after them."""
    from polyprof.engine.guard import release_worker

    try:
        return _select(registry, activities)
    finally:
        release_worker()


def _select(registry: Registry, activities: Iterable[Any] | None) -> Selection:
    """None: every group whose backend is available here (but those whose backend says
    ``on_by_default = False``). Groups asked for explicitly whose backends are
    all unavailable raise BackendUnavailableError with their reasons; no group at all is an error."""
    out = Selection()
    out.broken = [e for e in registry.entries(load=False) if e.error and e.origin in (ORIGIN_ENV, ORIGIN_EXPLICIT)]
    if activities is None:
        seen: set[str] = set()
        groups: set[str] = set()
        for entry in registry.entries():
            if entry.broken or entry.name in seen:
                continue
            seen.add(entry.name)
            if not backend_traits(entry.backend).on_by_default:
                continue  # a costly backend (the python tracer): only when its group is asked for
            chosen = Chosen(entry, registry.probe(entry))
            (out.selected if chosen.availability.available else out.unavailable).append(chosen)
            if chosen.availability.available:
                groups |= chosen.groups
        out.groups = sorted(groups)
        return out
    if isinstance(activities, (str, bytes)):
        activities = [activities]
    groups_list = [activity_group_name(a) for a in activities]
    if not groups_list:
        raise ConfigError(
            "activities is empty: name at least one group (e.g. ['cpu']), or pass None for every group "
            "available here"
        )
    if len(set(groups_list)) != len(groups_list):
        raise ConfigError(f"an activity group is listed twice: {groups_list}")
    chosen_by_name: dict[str, Chosen] = {}
    for group, entries in registry.for_activities(groups_list).items():
        results = []
        for entry in entries:
            if entry.name not in chosen_by_name:
                chosen_by_name[entry.name] = Chosen(entry, registry.probe(entry))
            results.append(chosen_by_name[entry.name])
        if not any(r.availability.available for r in results):
            reasons = "; ".join(f"{r.name}: {r.availability.reason}" for r in results)
            raise BackendUnavailableError(f"activity {group} cannot be profiled here: {reasons}")
    for chosen in chosen_by_name.values():
        (out.selected if chosen.availability.available else out.unavailable).append(chosen)
    out.groups = groups_list
    return out


def check_backend_options(
    selection: Selection, backend_options: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """Each selected backend's options, checked by its declared ``options`` schema and its
    ``check_options`` (if any), with the schema's defaults filled in."""
    if backend_options is not None and not isinstance(backend_options, Mapping):
        raise ConfigError("backend_options must map backend names to dicts of options")
    for name, value in (backend_options or {}).items():
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"backend_options[{name!r}] must be a dict of that backend's options, got {type(value).__name__}"
            )
    given = {k: dict(v) for k, v in (backend_options or {}).items()}
    names = set(selection.names)
    for name in given:
        if name not in names:
            raise UnknownNameError(
                "backend", name, names, " (backend_options names a backend this profile does not use)"
            )
    out = {}
    for chosen in selection.selected:
        options = given.get(chosen.name, {})
        schema = getattr(chosen.entry.backend, "options", None)
        if schema is not None and callable(getattr(schema, "check", None)):
            options = schema.check(chosen.name, options)
        checker = getattr(chosen.entry.backend, "check_options", None)
        if checker is not None:
            try:
                checker(options)
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(f"backend {chosen.name!r} rejected its options: {exc}") from exc
        out[chosen.name] = options
    return out


def kind_filters(selection: Selection, activity_filters: Mapping[str, Iterable[int]] | None) -> dict[str, set[int]]:
    """Backend name -> the kinds kept of its rows, from group -> kinds filters."""
    if not activity_filters:
        return {}
    by_group = {activity_group_name(g): {int(k) for k in kinds} for g, kinds in activity_filters.items()}
    out: dict[str, set[int]] = {}
    for chosen in selection.selected:
        hits = [g for g in chosen.groups if g in by_group]
        if hits:
            out[chosen.name] = set().union(*(by_group[g] for g in hits))
    return out
