"""Activity groups every ``polyprof.profiler`` profile adds or leaves out, whoever made the profile.

A framework that makes its own profiler asks for torch's groups (``[CPU, CUDA]``); these settings put
the devices it never heard of on its timeline, without a code change::

    POLYPROF_ACTIVITIES=+opencl,+counters python train.py

    # pyproject.toml (the project's: the nearest one up from the working directory)
    [tool.polyprof]
    activities = ["+opencl", "+counters"]

    # or polyprof.toml, the same keys at its top level
    activities = "+opencl,-cuda"

The files are read from the working directory and the project's folder only (the nearest folder up
from the working directory that has a ``pyproject.toml``; the nearer file wins), and only when owned by this user or root
and not writable by others: another user's file in a shared folder is data nobody asked for, and a
warning names it and why it was not read.

Each entry is ``+GROUP`` (added to every profile; a bare ``GROUP`` too) or ``-GROUP`` (left out even
where asked for). The environment variable wins over the files; ``polyprof.toml`` over
``pyproject.toml`` in the same folder. An unknown group is a :class:`~polyprof.errors.ConfigError` that
lists the installed ones, raised before anything records: where the profile is made and by ``polyprof
run`` before the script starts; the start-up hook says it in one warning line when torch is imported.
Reading the files needs ``tomllib`` (Python 3.11+) or ``tomli``; without either they are ignored.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

from polyprof.errors import ConfigError

ENV = "POLYPROF_ACTIVITIES"
FILES = ("polyprof.toml", "pyproject.toml")


@dataclass(frozen=True)
class ActivityEdits:
    """Groups to add to and remove from a profile's activities, and where they were said."""

    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.add or self.remove)

    def apply(self, groups: list[Any] | None, registry: Any = None) -> list[Any] | None:
        """`groups` (a profile's activities; None: every available group) with the edits made."""
        if not self:
            return groups
        from polyprof.engine.selection import activity_group_name

        if groups is None:
            if not self.remove:
                return None  # every available group already, the added ones included where available
            from polyprof.engine.registry import default
            from polyprof.engine.selection import select_backends

            groups = list(select_backends(registry or default, None).groups)
        names = {activity_group_name(g) for g in groups}
        kept = [g for g in groups if activity_group_name(g) not in self.remove]
        return kept + [g for g in self.add if g not in names and g not in self.remove]


def parse(text: Any, source: str) -> ActivityEdits:
    """``"+opencl,-cuda"`` (or a list of entries) into edits; checked against the installed groups."""
    if not isinstance(text, (str, list, tuple)):
        raise ConfigError(f"{source}: give a string such as '+opencl,-cuda' or a list of them, got {text!r}")
    entries = text.split(",") if isinstance(text, str) else list(text)
    add: list[str] = []
    remove: list[str] = []
    for raw in entries:
        if not isinstance(raw, str):
            raise ConfigError(f"{source}: activities entries must be strings such as '+opencl', got {raw!r}")
        entry = raw.strip()
        if not entry:
            continue
        sign, name = (entry[0], entry[1:].strip()) if entry[0] in "+-" else ("+", entry)
        (remove if sign == "-" else add).append(name.upper())
    edits = ActivityEdits(tuple(add), tuple(remove), source)
    check(edits)
    return edits


def check(edits: ActivityEdits) -> None:
    """Raise ConfigError naming what is installed if an edit names a group no backend serves."""
    from polyprof.profiler.activity import TORCH_MEMBERS, installed_groups

    known = installed_groups() | {m.upper() for m in TORCH_MEMBERS}
    unknown = [g for g in (*edits.add, *edits.remove) if g not in known]
    if unknown:
        raise ConfigError(
            f"{edits.source}: unknown activity group {', '.join(map(repr, unknown))}; installed groups: "
            f"{', '.join(sorted(installed_groups()))} (a device's group appears when its polyprof plugin is "
            "installed: see `polyprof backends`)"
        )


def activity_edits(lenient: bool = False) -> ActivityEdits:
    """The edits in force: POLYPROF_ACTIVITIES, else the nearest configuration file's, else none.
    A broken setting raises ConfigError, or with `lenient` (the profiles made behind torch.profiler,
    which a framework makes mid-run) is said once on stderr and ignored."""
    try:
        return _edits(os.environ.get(ENV, ""), os.getcwd())
    except ConfigError as exc:
        if not lenient:
            raise
        _say_once(f"{exc} (ignored by the profilers torch.profiler makes; polyprof.profiler.profile refuses it)")
        return ActivityEdits()


_said: set[str] = set()  # broken settings already said (once per process)


@functools.lru_cache(maxsize=8)
def _edits(env: str, cwd: str) -> ActivityEdits:
    if env.strip():
        return parse(env, ENV)
    found = _from_files(cwd)
    return found if found is not None else ActivityEdits()


MAX_CONFIG_BYTES = 1 << 20  # a configuration file larger than this is not one


def project_folder(cwd: str) -> str:
    """The nearest folder up from `cwd` with a pyproject.toml, else `cwd` itself."""
    folder = cwd
    while not os.path.isfile(os.path.join(folder, "pyproject.toml")):
        parent = os.path.dirname(folder)
        if parent == folder:
            return cwd
        folder = parent
    return folder


def _from_files(cwd: str) -> ActivityEdits | None:
    loads = _toml_loader()
    if loads is None:
        return None
    project = project_folder(cwd)
    for folder in (cwd, project) if project != cwd else (cwd,):
        for name in FILES:
            path = os.path.join(folder, name)
            text = _trusted_text(path)
            if text is None:
                continue
            try:
                data = loads(text)
            except ValueError as exc:
                raise ConfigError(f"{path} cannot be read as TOML: {exc}") from exc
            table = data if name == "polyprof.toml" else data.get("tool", {}).get("polyprof")
            if isinstance(table, dict) and "activities" in table:
                return parse(table["activities"], f"{path}: activities")
    return None


def _trusted_text(path: str) -> str | None:
    """The text of the configuration file at `path`: None where there is none, or (said once) where it
    is not this user's or root's, is writable by others, is not a regular file or is too large."""
    from polyprof.formats.common.paths import read_owned_file

    data, why = read_owned_file(path, MAX_CONFIG_BYTES, not_writable_by_others=True)
    if why is not None:
        _say_once(f"{path} not read: {why}")
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} cannot be read as TOML: {exc}") from exc


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"polyprof: {message}", file=sys.stderr, flush=True)


def _toml_loader() -> Any:
    try:
        import tomllib

        return tomllib.loads
    except ImportError:
        try:
            import tomli

            return tomli.loads
        except ImportError:
            return None
