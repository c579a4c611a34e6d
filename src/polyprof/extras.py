"""polyprof's optional extras: which libraries each brings, and the one-line error when one is missing.

The one owner of "which ``pip install`` fixes this"::

    from polyprof.extras import require

    require("store", "polyprof store")   # MissingExtra: polyprof store needs the 'store' extra
                                          # (pyarrow, duckdb): pip install 'polyprof[store]'
    install_hint("report")               # "pip install 'polyprof[report]'"

The command line turns a :class:`MissingExtra`, and a ``ModuleNotFoundError`` of a library listed here
that escaped a command, into that one line and exit status 2.
"""

from __future__ import annotations

import importlib.util

from polyprof.errors import ConfigError

#: extra -> the top-level modules it installs (pyproject.toml's [project.optional-dependencies])
EXTRAS: dict[str, tuple[str, ...]] = {
    "store": ("pyarrow", "duckdb"),
    "spark": ("pyspark", "sqlglot"),
    "report": ("plotly",),
    "counters": ("psutil",),
    "torch": ("torch",),
}

_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}


class MissingExtra(ConfigError):
    """A command or call needs an optional extra that is not installed."""

    def __init__(self, extra: str, what: str, missing: list[str]) -> None:
        super().__init__(
            f"{what} needs the '{extra}' extra ({', '.join(missing)} not installed): {install_hint(extra)}"
        )
        self.extra = extra
        self.missing = missing


def install_hint(extra: str) -> str:
    """The command that installs `extra`; torch is installed by name (its build is the user's choice)."""
    return "pip install torch" if extra == "torch" else f"pip install 'polyprof[{extra}]'"


def missing(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here (found without importing them)."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` naming `what` (a command or a feature) if `extra` is not installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, what, absent)


def extra_for(exc: BaseException) -> str | None:
    """The extra whose library `exc` (an ImportError) failed to import, if it is one of ours."""
    name = getattr(exc, "name", None) or ""
    return _EXTRA_OF.get(name.split(".")[0])
