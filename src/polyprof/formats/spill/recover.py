"""A trace from a spill that a killed process left behind (``polyprof recover SPILL``)::

    trace = recover_trace(".t.json.gz.spill")
    trace.metadata["polyprof"]["partial"]   # what ended it, what it covers, which backends had flushed

Everything the spill holds up to its first torn chunk is merged as a profile's windows are (a ring's
spill with its older generation, ``SPILL.previous``, before it, and the rows a crash wrote,
``SPILL.crash``, after it); the trace is marked partial: rows not yet handed over when the process
died (the last flush interval) are missing, but for the spans and instants a crash wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from polyprof._version import __version__
from polyprof.formats.spill.file import read_spill
from polyprof.merge import merge
from polyprof.model import BackendStatus, CollectedPart, Trace


def recover_trace(path: str) -> Trace:
    from polyprof.formats.common.source import max_trace_bytes, read_bytes
    from polyprof.formats.perfetto.read import looks_like_perfetto

    data = read_bytes(path, max_trace_bytes())
    if looks_like_perfetto(data):
        return _recover_perfetto(path, data)
    spill = _with_previous(read_spill(path, data), path)
    statuses = latest_statuses(spill.parts)
    parts = list(spill.parts)
    crash = read_crash_beside(path)
    if crash is not None:
        from polyprof.formats.spill.crash import crash_parts

        parts += crash_parts(crash, statuses)
    starts = [int(p.activities["start"].min()) for p in parts if len(p.activities)]
    ends = [int(p.activities["end"].max()) for p in parts if len(p.activities)]
    recovery = Recovery.of(path, spill, statuses, crash, starts, ends)
    return merge(parts, window=recovery.window, epoch_offset_ns=recovery.epoch_offset_ns, metadata=recovery.metadata)


def latest_statuses(parts: list[CollectedPart]) -> dict[str, BackendStatus]:
    """Each backend's latest status (it holds its counts so far): its last part's, which the merge takes
    for the trace."""
    return {part.backend: part.status for part in parts}


@dataclasses.dataclass
class Recovery:
    """What a spill's trace says of itself: its window (from the first recording window's start or row
    to the last row, window end or crash), the clock's epoch and the metadata that marks it partial."""

    window: tuple[int, int]
    epoch_offset_ns: int
    metadata: dict[str, Any]

    @classmethod
    def of(cls, path: str, spill: Any, statuses: dict[str, BackendStatus], crash: Any, starts: list[int],
           ends: list[int]) -> Recovery:
        """From the spill's header and windows, its backends' statuses, the crash's rows (or None) and
        the parts' first starts and last ends."""
        header = spill.header
        windows = [w["window_start"] for w in spill.windows if "window_start" in w]  # (ints: read_spill checked)
        ends = ends + [w["window_end"] for w in spill.windows if "window_end" in w] + ([crash.at_ns] if crash else [])
        first = min(windows + starts) if windows or starts else 0
        last = max(ends + [first])
        epoch = int(header.get("epoch_offset_ns", 0) or 0)
        partial = {
            "ended": "cleanly (the profile stopped; its trace was not written)" if spill.ended else
                     "without a clean end: the process was killed or exited without stopping the profile",
            "spill": path,
            "covered_epoch_ns": [first + epoch, last + epoch],
            "windows": len(windows),
            "backends_flushed": sorted(statuses),
            "not_in_it": _not_in_it(spill.windows),
            "chunks": spill.chunks,
            "torn_bytes": spill.torn_bytes,
            "dropped": spill.dropped,  # chunks or fields whose checksum matched but that could not be used
            "missing": "nothing: every window handed everything over" if _all_windows_ended(spill.windows) else
                       f"what was recorded after the last flush (every {header.get('flush_interval_s', '?')} s)"
                       + (", but for the spans, instants and operators written at the crash (without their args)"
                          if crash else ""),
        }
        if crash is not None:
            partial["crash"] = {"at_epoch_ns": crash.at_ns + epoch, "rows": crash.rows, "threads": len(crash.threads),
                                "whole": crash.whole}
        metadata = dict(header.get("metadata") or {})
        metadata["polyprof"] = {
            "version": __version__,
            "recorded_by": header.get("version"),
            "activities": header.get("activities", []),
            "pid": header.get("pid"),
            "argv": header.get("argv"),
            "clock": {"host": "perf_counter_ns", "epoch_offset_ns": epoch},
            "partial": partial,
        }
        return cls((first, last), epoch, metadata)


def _with_previous(spill: Any, path: str) -> Any:
    """A ring's spill with its older generation (``PATH.previous``, see RingSpillListener) before it."""
    import os

    from polyprof.formats.common.source import max_trace_bytes, read_bytes
    from polyprof.formats.spill.names import PREVIOUS

    path = os.fspath(path)
    if not os.path.isfile(path + PREVIOUS):
        return spill
    older = read_spill(path + PREVIOUS, read_bytes(path + PREVIOUS, max_trace_bytes()))
    return dataclasses.replace(
        spill,
        windows=older.windows + [w for w in spill.windows if w not in older.windows],  # (a window starts in both)
        parts=older.parts + spill.parts,
        chunks=older.chunks + spill.chunks,
        torn_bytes=older.torn_bytes + spill.torn_bytes,
        dropped=older.dropped + spill.dropped,
    )


#: a crash file larger than this is not read (it holds the rows since the last hand-over: a second's)
MAX_CRASH_BYTES = 1 << 30


def read_crash_beside(path: str) -> Any:
    """The rows a crash wrote beside the spill (``SPILL.crash``), or None. It is another process's file:
    read only when it is a regular file of this user or root (never through a link, never waiting on a
    FIFO) and at most MAX_CRASH_BYTES; otherwise, and for rows dropped from it, a warning says why."""
    import os

    from polyprof.errors import warn_user
    from polyprof.formats.common.paths import read_owned_file
    from polyprof.formats.spill.crash import CRASH_SUFFIX, read_crash

    crash_path = os.fspath(path) + CRASH_SUFFIX
    data, why = read_owned_file(crash_path, MAX_CRASH_BYTES)
    if why is not None:
        warn_user(f"{crash_path} not read: {why}")
    if data is None:
        return None
    crash = read_crash(data)
    if crash is not None and crash.dropped:
        warn_user(f"{crash_path}: {crash.dropped:,} rows of no type the recorder writes were left out (a damaged file)")
    return crash


def _not_in_it(windows: list[dict[str, Any]]) -> list[str]:
    """Backends of the last window whose rows are missing: it did not end, and they hand rows over only
    at a window's end (no ``flush``)."""
    last: dict[str, Any] = {}
    for w in windows:
        if "window_start" in w:
            last = w
        elif "window_end" in w:
            last = {}
    names = lambda key: {b for b in last.get(key, []) if isinstance(b, str)}  # noqa: E731
    return sorted(names("backends") - names("flushing"))


def _all_windows_ended(windows: list[dict[str, Any]]) -> bool:
    starts = sum(1 for w in windows if "window_start" in w)
    return starts > 0 and starts == sum(1 for w in windows if "window_end" in w)


def _recover_perfetto(path: str, data: bytes) -> Trace:
    """A Perfetto spill (the spill of a .pftrace output): a trace as it is, less a torn last packet (read
    by the C packet scanner; by the reference reader where it declines, which names what is wrong)."""
    from polyprof.formats.perfetto.read import PacketReader, read_with
    from polyprof.formats.perfetto.scan import scan_torn

    scanned = scan_torn(_told(memoryview(data), "spill bytes read"), path)
    if scanned is not None:
        trace, (packets, sequences, torn) = scanned
    else:
        reader = PacketReader(path, tolerate_torn=True)
        trace = read_with(reader, data)
        packets, sequences, torn = reader.packet, len(reader.sequences), reader.torn_bytes
    trace.metadata["polyprof"] = perfetto_partial(trace.metadata, path, trace.window, trace.epoch_offset_ns,
                                                  (packets, sequences, torn))
    return trace


def _told(data: memoryview, what: str, piece: int = 4 << 20) -> Iterator[memoryview]:
    """`data` in pieces, each one's bytes told to a progress bar once it has been used."""
    from polyprof import progress

    advance = progress.task(what, total=len(data))
    for at in range(0, len(data), piece):
        yield data[at : at + piece]
        advance(min(piece, len(data) - at))


def perfetto_partial(metadata: dict[str, Any], path: str, window: tuple[int, int], epoch_offset_ns: int,
                     scanned: tuple[int, int, int]) -> dict[str, Any]:
    """The ``polyprof`` metadata of a Perfetto spill's trace (its `metadata` as read, its `window`), from
    what its read `scanned`: (packets, packet sequences, bytes of a torn last packet left out)."""
    packets, sequences, torn = scanned
    return {
        **(metadata.get("polyprof") or {}),
        "version": __version__,
        "partial": {
            "ended": "without a clean end, or cleanly without its trace written (a Perfetto spill has no end marker)",
            "spill": path,
            "covered_epoch_ns": [window[0] + epoch_offset_ns, window[1] + epoch_offset_ns],
            "chunks": sequences,  # one packet sequence per append
            "packets": packets,
            "torn_bytes": torn,
            "backends_flushed": [],  # a Perfetto spill does not carry the backends' status
            "missing": "what was recorded after the last flush",
        },
    }
