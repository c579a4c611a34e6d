"""Trace files, one package per format, both directions: Chrome trace JSON in Kineto's dialect
(:mod:`.chrome`), Perfetto's protobuf (:mod:`.perfetto`) and polyprof's crash-safe spill
(:mod:`.spill`); :mod:`.common` holds what they share (limits on what is read, values, the one way a
reader finishes a :class:`~polyprof.model.Trace`, output paths). Tools built on them (convert, merge
ranks, recover) live in :mod:`polyprof.tools`.

::

    from polyprof.formats import load_trace, write_trace
    trace = load_trace("rank0.json.gz")      # JSON or Perfetto, gzip or not: told apart by the bytes
    for chunk in open_chunks("rank0.json.gz", rows=50_000): ...   # any size, spills too: chunk.trace
    write_trace(trace, "rank0.pftrace")      # the format the path names

The names below load when first used, so that importing one format never imports the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "load_trace": "polyprof.formats.files",
    "open_chunks": "polyprof.formats.files",
    "Chunk": "polyprof.formats.common.chunk",
    "parse_trace": "polyprof.formats.files",
    "write_trace": "polyprof.formats.files",
    "format_of": "polyprof.formats.common.paths",
    "check_output_path": "polyprof.formats.common.paths",
    "dumps_chrome_trace": "polyprof.formats.chrome.write",
    "write_chrome_trace": "polyprof.formats.chrome.write",
    "dumps_perfetto_trace": "polyprof.formats.perfetto.write",
    "write_perfetto_trace": "polyprof.formats.perfetto.write",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'polyprof.formats' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
