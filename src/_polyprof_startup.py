"""polyprof's start-up hook: what ``polyprof-startup.pth`` runs as the interpreter starts, when one of
polyprof's variables is set. Standard library only, and nothing of polyprof's: it reads the variables,
checks their values and registers a finder, and does nothing else (no thread, no folder, no import of
polyprof), so every Python process in the environment, pip's included, starts as fast as without it.

What the variables switch on arms later, in the program (:func:`polyprof.startup.arm`):

* when ``import torch`` completes: ``POLYPROF_TORCH_PROFILER=1`` (polyprof behind ``torch.profiler``),
  ``POLYPROF_FLIGHT_RECORDER=SPEC`` (the flight recorder) and ``POLYPROF_ON_DEMAND=1`` (capturable);
  so nothing races torch's import, however slow (a cluster's file system), and the recorder sees the
  torch operator observer;
* ``POLYPROF_ON_DEMAND=1`` also when a script or a module starts (``python train.py``, ``python -m
  pkg``): a program without torch is capturable too. ``python -c`` one-liners only at torch's import.

Left alone (nothing armed, ever): processes that are not the user's program: pip, torchrun's launcher
(``torchrun``, ``python -m torch.distributed.run``; its workers are the program), build front ends and
backends, and the programs named in ``POLYPROF_STARTUP_SKIP`` (comma-separated names, as ``pip`` or
``torch.distributed.run``; ``*``: every process that inherits it).

A bad value is one warning line on stderr here, the variable then ignored in this process; where a
profile or the recorder is made from it (``polyprof run``, the API) it is the clean error instead.
This module is the one owner of the variables' syntax: :mod:`polyprof.flight.environment` and
:mod:`polyprof.profiler.behind_torch` read them through it.
"""

from __future__ import annotations

import os
import sys

TORCH_PROFILER, ON_DEMAND, FLIGHT = "POLYPROF_TORCH_PROFILER", "POLYPROF_ON_DEMAND", "POLYPROF_FLIGHT_RECORDER"
ACTIVITIES, SKIP = "POLYPROF_ACTIVITIES", "POLYPROF_STARTUP_SKIP"
FLIGHT_DIR, FLIGHT_OPS = "POLYPROF_FLIGHT_DIR", "POLYPROF_FLIGHT_OPS"

_ON, _OFF = ("1", "true", "on", "yes"), ("", "0", "false", "off", "no")

#: programs that are never the user's: package installers, torchrun's launcher, build tools
NOT_THE_PROGRAM = frozenset({
    "pip", "pipx", "ensurepip", "venv", "virtualenv", "build", "wheel", "twine", "setup", "_in_process",
    "torchrun", "torch.distributed.run", "torch.distributed.launch", "torch.distributed.elastic.agent",
})

#: the flight recorder's settings the variable may give after its seconds (``30,hang_s=120``): name ->
#: kind; "off" makes the optional ones None (that trigger or cap off)
FLIGHT_SETTINGS = {
    "seconds": "seconds", "hang_s": "seconds|off", "slow_step": "number|off", "slow_step_s": "seconds|off",
    "after_s": "seconds|0", "min_gap_s": "seconds|0", "max_mb": "number|off", "max_captures": "count|off",
    "max_captures_mb": "number|off", "ops": "top|all|none", "format": "pftrace|json", "on_exception": "bool",
    "job": "bool", "crash_spill": "bool", "capturable": "bool", "out_dir": "folder",
}


class BadSetting(ValueError):
    """A variable's value that cannot be used; its message says which, and what to give instead."""


def flag(name: str, environ: dict[str, str] | None = None) -> bool:
    """A yes/no variable (1, true, on, yes / 0, false, off, no or unset), case and spaces aside."""
    text = (os.environ if environ is None else environ).get(name, "")
    value = text.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise BadSetting(f"{name}={text!r}: give 1 (on) or 0 (off)")


def flight_settings(text: str, source: str = FLIGHT) -> dict[str, object] | None:
    """``POLYPROF_FLIGHT_RECORDER``'s value as the recorder's settings: ``30`` (seconds), ``on`` (the
    default seconds), ``30,hang_s=120,slow_step=off``; None for 0, off or unset."""
    items = [item.strip() for item in text.split(",")]
    if items[0].lower() in _OFF and len(items) == 1:
        return None
    settings: dict[str, object] = {}
    for number, item in enumerate(items):
        if number == 0 and "=" not in item:
            if item.lower() not in _ON:
                settings["seconds"] = _value("seconds", item, f"{source}={text!r}")
            continue
        settings.update(flight_setting(item, f"{source}={text!r}"))
    return settings


def flight_setting(item: str, source: str) -> dict[str, object]:
    """One ``NAME=VALUE`` of the flight recorder's settings (``--flight-recorder-option`` takes these)."""
    name, sep, value = item.partition("=")
    name = name.strip()
    if not sep or name not in FLIGHT_SETTINGS:
        raise BadSetting(f"{source}: {item!r} is not NAME=VALUE with NAME one of {', '.join(FLIGHT_SETTINGS)}")
    return {name: _value(name, value.strip(), source)}


def _value(name: str, text: str, source: str) -> object:
    kind, lower = FLIGHT_SETTINGS[name], text.lower()
    if kind == "folder":
        if not text:
            raise BadSetting(f"{source}: {name} needs a folder")
        return text
    if kind == "bool":
        if lower in _ON or lower in _OFF and lower:
            return lower in _ON
        raise BadSetting(f"{source}: {name}={text!r}: give on or off")
    choices = kind.split("|")
    if choices[0] not in ("seconds", "number", "count"):
        if lower not in choices:
            raise BadSetting(f"{source}: {name}={text!r}: choose one of {', '.join(choices)}")
        return lower
    if "off" in choices and lower in ("off", "none"):
        return None
    try:
        number = int(text) if choices[0] == "count" else float(text)
    except ValueError:
        said = " or off" if "off" in choices else ""
        raise BadSetting(f"{source}: {name}={text!r}: give a number{said}") from None
    least = 0 if "0" in choices else 1 if choices[0] == "count" else None
    if number != number or number in (float("inf"), float("-inf")) or (number < least if least is not None else number <= 0):
        raise BadSetting(f"{source}: {name}={text!r}: give a finite number {'of at least ' + str(least) if least is not None else 'above 0'}")
    return number


def program_name(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> str:
    """What this process runs: the module of ``-m``, the script's name without ``.py``, ``-c``, or ""
    (the interactive interpreter)."""
    argv = sys.argv if argv is None else argv
    orig = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    first = argv[0] if argv else ""
    if first == "-m":
        for i, arg in enumerate(orig[1:], 1):
            if arg == "-m" and i + 1 < len(orig):
                return orig[i + 1]
            if arg.startswith("-m") and not arg.startswith("--"):
                return arg[2:]
    if first in ("-c", ""):
        return first
    name = os.path.basename(first)
    return name[:-3] if name.endswith(".py") else name


def users_program(name: str, environ: dict[str, str] | None = None) -> bool:
    """Whether the program `name` (:func:`program_name`) may be armed: not an installer, launcher or
    build tool, and not named in POLYPROF_STARTUP_SKIP."""
    skipped = {s.strip() for s in (os.environ if environ is None else environ).get(SKIP, "").split(",")}
    if "*" in skipped or name in skipped:
        return False
    top = name.split(".")[0]
    if name in NOT_THE_PROGRAM or top in ("pip", "setuptools", "pyproject_hooks", "pep517"):
        return False
    return not (top.startswith("pip") and top[3:].replace(".", "").isdigit())


def wanted(say: bool = True) -> dict[str, object]:
    """What the variables ask for in this process: ``{"torch_profiler": bool, "on_demand": bool,
    "flight": settings or None, "activities": bool}``; a bad value is left out (and said in one line
    where `say`: at start-up, once)."""
    found: dict[str, object] = {"torch_profiler": False, "on_demand": False, "flight": None,
                                "activities": bool(os.environ.get(ACTIVITIES, "").strip())}
    for key, name in (("torch_profiler", TORCH_PROFILER), ("on_demand", ON_DEMAND)):
        try:
            found[key] = flag(name)
        except BadSetting as exc:
            _say(exc, say)
    try:
        found["flight"] = flight_settings(os.environ.get(FLIGHT, ""))
    except BadSetting as exc:
        _say(exc, say)
    return found


def _say(exc: Exception, say: bool = True) -> None:
    if say:
        print(f"polyprof: {exc}; ignored in this process", file=sys.stderr, flush=True)


class PostImportHook:
    """Calls `callback(module)` once, right after `name` has been imported (a meta path finder by its
    methods: importing importlib.abc costs milliseconds); :mod:`polyprof.torch.import_hook`
    gives it to the rest of polyprof::

        hook = PostImportHook("torch", on_torch)
        hook.install()     # removed again after the call, or with hook.remove()
    """

    def __init__(self, name: str, callback: object) -> None:
        self.name, self.callback, self._busy = name, callback, False

    def find_spec(self, fullname: str, path: object, target: object = None) -> object:
        if fullname != self.name or self._busy:
            return None
        import importlib.util

        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        loader, hook = spec.loader, self

        class Loader:
            def create_module(self, s: object) -> object:
                return loader.create_module(s)

            def exec_module(self, module: object) -> None:
                loader.exec_module(module)
                hook.remove()
                hook.callback(module)  # type: ignore[operator]

        spec.loader = Loader()
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _arm(when: str) -> None:
    try:
        import polyprof.startup

        polyprof.startup.arm(when)
    except Exception as exc:  # noqa: BLE001 - the program runs on without polyprof
        print(f"polyprof: the start-up hook could not arm ({when}): {exc!r}", file=sys.stderr, flush=True)


def _on_audit(event: str, args: tuple) -> None:
    global _audit_open
    if _audit_open and event in ("cpython.run_file", "cpython.run_module"):
        _audit_open = False  # (an audit hook cannot be removed: it costs one comparison from here on)
        _arm("program start")


_audit_open = _installed = False


def install() -> None:
    """Read the variables and register what arms them later (see the module docstring)."""
    global _audit_open, _installed
    if _installed or not users_program(program_name()):
        return  # (site may read the same folder twice, through a lib64 link)
    _installed = True
    found = wanted()
    if not (found["torch_profiler"] or found["on_demand"] or found["flight"] or found["activities"]):
        return
    if "torch" in sys.modules:  # (imported by an earlier start-up file)
        sys.addaudithook(_on_audit)
        _audit_open = True
        return
    PostImportHook("torch", lambda _module: _arm("import torch")).install()
    if found["on_demand"] and program_name() not in ("-c", ""):
        sys.addaudithook(_on_audit)
        _audit_open = True
