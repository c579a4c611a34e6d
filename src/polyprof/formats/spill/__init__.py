"""The spill: what a recording hands over while it runs, appended to a file beside the output so that
a kill loses at most the last second. polyprof's checksummed chunks (:mod:`.file`), or for a Perfetto
output Perfetto packets that open as they are (:mod:`.perfetto`); beside a flight recorder's spill, the
rows a crash left (:mod:`.crash`). ``polyprof recover`` is :mod:`polyprof.formats.spill.recover`."""

from __future__ import annotations

from typing import Any


def open_spill(path: str, header: dict[str, Any]) -> Any:
    """A new spill writer at `path`: polyprof's checksummed chunks, or Perfetto packets for a path in
    a Perfetto format."""
    from polyprof.formats.common.paths import format_of

    if format_of(path) == "perfetto":
        from polyprof.formats.spill.perfetto import PerfettoSpill

        return PerfettoSpill.create(path, header)
    from polyprof.formats.spill.file import SpillWriter

    return SpillWriter.create(path, header)
