"""Which writer a trace path asks for: Perfetto protobuf for ``.pftrace`` / ``.perfetto-trace`` (and
``.gz`` after either), Kineto-dialect Chrome JSON for everything else.

::

    write_trace(trace, "t.pftrace")          # Perfetto
    write_trace(trace, "t.json.gz")          # Chrome JSON, gzip
    write_trace(trace, "t.bin", format="perfetto")
"""

from __future__ import annotations

import os
from typing import Any

from polyprof.errors import ConfigError

PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace")
FORMATS = ("json", "perfetto")


def format_of(path: str | os.PathLike, format: str | None = None) -> str:
    """"perfetto" or "json": `format` when given (checked), else what the path's suffix says."""
    if format is not None:
        if format not in FORMATS:
            raise ConfigError(f"unknown trace format {format!r}: use one of {', '.join(FORMATS)}")
        return format
    name = os.fspath(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return "perfetto" if name.endswith(PERFETTO_SUFFIXES) else "json"


def write_trace(trace: Any, path: str | os.PathLike, format: str | None = None) -> str:
    """Write `trace` in the format its path (or `format`) names; returns the path written."""
    if format_of(path, format) == "perfetto":
        from polyprof.export.perfetto import write_perfetto_trace

        return write_perfetto_trace(trace, path)
    from polyprof.export.chrome import write_chrome_trace

    return write_chrome_trace(trace, path)
