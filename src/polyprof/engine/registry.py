"""Finding backends at run time.

Three sources, in this order of precedence:

1. ``polyprof.register_backend(obj)`` in the program itself;
2. ``POLYPROF_BACKENDS=module:attr,other.module:attr`` in the environment;
3. entry points in the group ``polyprof.backends`` (``name = "module:attr"``) of every installed
   distribution, polyprof's own built-in backends included. A distribution also declares which
   activity groups each backend serves in the group ``polyprof.activities`` (``"GROUP.name" =
   "module:attr"``) so that a profile imports only the backends it needs.

Nothing is imported until a profile needs a backend's activity group or ``polyprof backends`` lists
them all. A backend that fails to import or breaks the contract is listed as broken with the reason;
it never takes the others down.
"""

from __future__ import annotations

import importlib
import os
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from polyprof.errors import BackendConflictError, BackendContractError, UnknownNameError
from polyprof.plugin.backend import Availability, contract_problems
from polyprof.plugin.traits import backend_traits

ENTRY_POINT_GROUP = "polyprof.backends"
ACTIVITY_GROUP = "polyprof.activities"
ENV_VAR = "POLYPROF_BACKENDS"
#: Comma-separated backend names to ignore although installed (e.g. one that misbehaves here).
DISABLE_ENV_VAR = "POLYPROF_DISABLED_BACKENDS"

#: Where the well-known activity groups come from, for the hint when none is installed. Only text:
#: nothing is imported by these names.
KNOWN_PLUGINS = {
    "OPENCL": "polyprof-opencl",
    "CUDA": "polyprof-cuda",
    "XPU": "polyprof-xpu",
}

#: a probe must be cheap (docs/writing-a-backend.md): one that takes longer is treated as unavailable
PROBE_TIMEOUT_S = 10.0

ORIGIN_EXPLICIT = "register_backend"
ORIGIN_ENV = ENV_VAR
ORIGIN_ENTRY_POINT = "entry point"


@dataclass
class BackendEntry:
    """One registered backend, loaded or not yet."""

    name: str
    origin: str
    distribution: str = ""
    version: str = ""
    reference: str = ""  # "module:attr" for lazy entries
    declared_activities: frozenset[str] = frozenset()
    backend: Any = None
    error: str = ""  # import failure or contract violation: the entry is broken
    conflict: str = ""  # another distribution uses the same name
    _availability: Availability | None = field(default=None, repr=False)

    @property
    def loaded(self) -> bool:
        return self.backend is not None

    @property
    def broken(self) -> bool:
        return bool(self.error or self.conflict)

    @property
    def activities(self) -> frozenset[str]:
        if self.backend is not None:
            return frozenset(self.backend.activities)
        return self.declared_activities

    @property
    def source(self) -> str:
        if self.distribution:
            return f"{self.distribution} {self.version}".strip()
        return self.origin


def _load_reference(reference: str) -> Any:
    module_name, _, attr = reference.partition(":")
    obj = importlib.import_module(module_name.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj


class Registry:
    """The set of backends known to this process. ``polyprof.engine.registry.default`` is the shared one."""

    def __init__(self, *, use_entry_points: bool = True, use_env: bool = True) -> None:
        self._explicit: dict[str, BackendEntry] = {}
        self._discovered: dict[str, BackendEntry] | None = None
        self._use_entry_points = use_entry_points
        self._use_env = use_env
        self._lock = threading.RLock()

    # -- registration -------------------------------------------------------------------------------
    def register(self, backend: Any) -> BackendEntry:
        """Register a backend object. Raises BackendContractError (naming it) if it breaks the contract,
        ValueError if it reuses a name."""
        problems = contract_problems(backend)
        if problems:
            raise BackendContractError(str(getattr(backend, "name", backend)), "cannot be registered: " + "; ".join(problems))
        with self._lock:
            if backend.name in self._explicit and self._explicit[backend.name].backend is not backend:
                raise ValueError(
                    f"a backend named {backend.name!r} is already registered with register_backend()"
                )
            entry = BackendEntry(backend.name, ORIGIN_EXPLICIT, backend=backend)
            self._explicit[backend.name] = entry
            return entry

    def unregister(self, name: str) -> None:
        with self._lock:
            self._explicit.pop(name, None)

    def refresh(self) -> None:
        """Forget discovered entries (re-read the environment and entry points next time)."""
        with self._lock:
            self._discovered = None

    # -- discovery ----------------------------------------------------------------------------------
    def _discover(self) -> dict[str, BackendEntry]:
        with self._lock:
            if self._discovered is None:
                found: dict[str, BackendEntry] = {}
                if self._use_entry_points:
                    self._discover_entry_points(found)
                if self._use_env:
                    self._discover_env(found)
                self._discovered = found
            return self._discovered

    def _discover_env(self, found: dict[str, BackendEntry]) -> None:
        for ref in filter(None, (r.strip() for r in os.environ.get(ENV_VAR, "").split(","))):
            entry = BackendEntry("", ORIGIN_ENV, reference=ref)
            self._load(entry)
            if not entry.name:
                entry.name = ref
            found[entry.name] = entry  # the environment overrides installed entry points

    def _discover_entry_points(self, found: dict[str, BackendEntry]) -> None:
        declared: dict[str, set[str]] = {}
        for ep in metadata.entry_points(group=ACTIVITY_GROUP):
            group, _, backend_name = ep.name.partition(".")
            if backend_name:
                declared.setdefault(backend_name, set()).add(group)
        disabled = {n.strip() for n in os.environ.get(DISABLE_ENV_VAR, "").split(",") if n.strip()}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in disabled:
                continue
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else ""
            version = dist.version if dist is not None else ""
            entry = BackendEntry(
                ep.name,
                ORIGIN_ENTRY_POINT,
                distribution=dist_name,
                version=version,
                reference=ep.value,
                declared_activities=frozenset(declared.get(ep.name, ())),
            )
            previous = found.get(ep.name)
            if previous is not None:
                if previous.distribution == dist_name and previous.reference == ep.value:
                    continue  # the same distribution seen twice on sys.path
                message = (
                    f"backend name {ep.name!r} is registered by two distributions: "
                    f"{previous.source} ({previous.reference}) and {entry.source} ({entry.reference}); "
                    f"uninstall one of them"
                )
                previous.conflict = entry.conflict = message
                found[f"{ep.name} [{entry.source}]"] = entry
                continue
            found[ep.name] = entry

    def _load(self, entry: BackendEntry) -> None:
        if entry.loaded or entry.error:
            return
        try:
            backend = _load_reference(entry.reference)
        except BaseException as exc:  # an import can fail in any way; it must not take polyprof down
            if isinstance(exc, KeyboardInterrupt):
                raise
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            entry.error = f"import of {entry.reference} failed: {last}"
            return
        problems = contract_problems(backend)
        if problems:
            entry.error = "does not follow the backend contract: " + "; ".join(problems)
            return
        if entry.origin == ORIGIN_ENTRY_POINT and backend.name != entry.name:
            entry.error = f"entry point is named {entry.name!r} but the backend calls itself {backend.name!r}"
            return
        if entry.declared_activities and entry.declared_activities != frozenset(backend.activities):
            entry.error = (
                f"declares activity groups {sorted(entry.declared_activities)} in its {ACTIVITY_GROUP} entry "
                f"points but serves {sorted(backend.activities)}"
            )
            return
        entry.backend = backend
        if not entry.name:
            entry.name = backend.name

    # -- queries ------------------------------------------------------------------------------------
    def entries(self, load: bool = True) -> list[BackendEntry]:
        """Every known backend (loading each unless `load` is False), explicit ones first."""
        with self._lock:
            merged = dict(self._discover())
            merged.update(self._explicit)
            result = list(merged.values())
        if load:
            for entry in result:
                if not entry.conflict:
                    self._load(entry)
        return result

    def get(self, name: str) -> BackendEntry:
        """The entry of one backend by name, loaded. Raises UnknownNameError / BackendConflictError."""
        with self._lock:
            entry = self._explicit.get(name) or self._discover().get(name)
        if entry is None:
            raise UnknownNameError(
                "backend", name, [e.name for e in self.entries(load=False) if "[" not in e.name]
            )
        if entry.conflict:
            raise BackendConflictError(entry.conflict)
        self._load(entry)
        return entry

    def for_activities(self, groups: Iterable[str]) -> dict[str, list[BackendEntry]]:
        """Backends serving each requested activity group (case-insensitive), importing only those needed.

        Backends that did not declare their groups are imported to find out. Unknown groups raise
        UnknownNameError listing the known ones.
        """
        ordered = list(dict.fromkeys(g.upper() for g in groups))  # the caller's order, so runs repeat
        wanted = set(ordered)
        all_entries = self.entries(load=False)
        result: dict[str, list[BackendEntry]] = {g: [] for g in ordered}
        for entry in all_entries:
            if entry.conflict:
                if wanted & entry.declared_activities:
                    raise BackendConflictError(entry.conflict)
                continue
            if (
                not entry.loaded
                and not entry.error
                and (not entry.declared_activities or wanted & entry.declared_activities)
            ):
                self._load(entry)
            for g in wanted & {a.upper() for a in entry.activities}:
                result[g].append(entry)
        for g, entries in result.items():
            if not entries:
                known = {a.upper() for e in all_entries for a in e.activities}
                broken = [e for e in all_entries if e.error]
                extra = ""
                if g in KNOWN_PLUGINS:
                    extra += (
                        f" Activity {g} comes from the plugin distribution {KNOWN_PLUGINS[g]}, which is not "
                        f"installed (or is disabled by {DISABLE_ENV_VAR}): pip install {KNOWN_PLUGINS[g]}."
                    )
                if broken:
                    extra += " Broken backends (see `polyprof backends`): " + "; ".join(
                        f"{e.name}: {e.error}" for e in broken
                    )
                raise UnknownNameError("activity", g, known, extra)
        return result

    def probe(self, entry: BackendEntry) -> Availability:
        """Ask a loaded backend whether it can run; a probe that raises, or does not answer within
        PROBE_TIMEOUT_S, counts as unavailable (with the reason)."""
        if entry.backend is None:
            return Availability.no(entry.error or entry.conflict or "not loaded")
        from polyprof.engine.guard import CallOutcome, describe, run_with_timeout

        if backend_traits(entry.backend).in_process:  # polyprof's own backends: called directly
            try:
                outcome = CallOutcome(True, entry.backend.probe())
            except Exception as exc:
                outcome = CallOutcome(False, exc)
        else:
            outcome = run_with_timeout(entry.backend.probe, timeout_s=PROBE_TIMEOUT_S, what=f"{entry.name}.probe()")
        if outcome.timed_out:
            return Availability.no(
                f"probe() did not return within {PROBE_TIMEOUT_S:g} s: the backend is left out (its call is "
                "abandoned on a guard thread)"
            )
        if not outcome.ok:
            return Availability.no(f"probe() raised {describe(outcome.value)}")
        if not isinstance(outcome.value, Availability):
            return Availability.no(f"probe() returned {type(outcome.value).__name__}, not Availability")
        return outcome.value


default = Registry()


def register_backend(backend: Any) -> Any:
    """Register a backend object with the default registry; returns it (usable as a decorator)."""
    default.register(backend)
    return backend
