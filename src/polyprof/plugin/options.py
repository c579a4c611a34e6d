"""Declarative backend options: a backend says what it takes, the engine checks what a user gave
before anything starts, with errors that name the backend, the option and what would be right::

    OPTIONS = OptionSchema(
        Option("buffer_size_mb", int, default=8, minimum=1, help="CUPTI buffer size"),
        Option("apis", str, default="default", choices=("default", "all")),
        Option("kinds", list, items=str, choices=("kernel", "memcpy")),
    )

    class MyBackend:
        options = OPTIONS          # checked by the engine; ctx.options has the defaults filled in

``OPTIONS.check("cuda", {"buffer_size_mb": 0})`` raises ConfigError("cuda: 'buffer_size_mb' must be an
integer >= 1, got 0").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polyprof.errors import ConfigError

_MISSING = object()


@dataclass(frozen=True)
class Option:
    """One option: its type (``int``, ``float``, ``str``, ``bool`` or ``list``), default, bounds."""

    name: str
    type: type
    default: Any = None
    minimum: float | None = None
    choices: Sequence[Any] | None = None  # allowed values (for a list: allowed items)
    items: type | None = None  # a list's item type
    help: str = ""

    def problem(self, value: Any) -> str:
        """What is wrong with `value` ("" when nothing)."""
        if self.type in (int, float):
            numeric = isinstance(value, (int, float) if self.type is float else int)
            if isinstance(value, bool) or not numeric:
                return f"must be {'a number' if self.type is float else 'an integer'}"
            if self.minimum is not None and value < self.minimum:
                noun = "an integer" if self.type is int else "a number"
                return "must be a positive integer" if self.type is int and self.minimum == 1 else f"must be {noun} >= {self.minimum:g}"
        elif self.type is bool:
            if not isinstance(value, bool):
                return "must be True or False"
        elif self.type is list:
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                return f"must be a list{f' of {self.items.__name__}' if self.items else ''}"
            values = list(value)
            if self.items is not None and not all(
                isinstance(v, self.items) and not (self.items is int and isinstance(v, bool)) for v in values
            ):
                return f"must be a list of {self.items.__name__}"
            bad = [v for v in values if self.choices is not None and v not in self.choices]
            if bad:
                return f"has unsupported item(s) {bad}; supported: {', '.join(map(str, self.choices or ()))}"
            return ""
        elif not isinstance(value, self.type):
            return f"must be a {self.type.__name__}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(repr, self.choices))}"
        return ""


class OptionSchema:
    """The options of one backend (see the module docstring)."""

    def __init__(self, *options: Option) -> None:
        self.options = {o.name: o for o in options}

    def check(self, backend: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` checked and completed with the defaults; ConfigError naming what is wrong."""
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise ConfigError(f"{backend}: unknown option(s) {unknown}; known: {', '.join(sorted(self.options))}")
        out: dict[str, Any] = {}
        for name, option in self.options.items():
            value = given.get(name, _MISSING)
            if value is _MISSING:
                if option.default is not None:
                    out[name] = option.default
                continue
            problem = option.problem(value)
            if problem:
                raise ConfigError(f"{backend}: {name!r} {problem}, got {value!r}")
            out[name] = list(value) if option.type is list else value
        return out

    def describe(self) -> list[str]:
        """One line per option (for ``polyprof backends --options`` and docs)."""
        return [
            f"{o.name} ({o.type.__name__}{f', default {o.default!r}' if o.default is not None else ''}){f': {o.help}' if o.help else ''}"
            for o in self.options.values()
        ]
