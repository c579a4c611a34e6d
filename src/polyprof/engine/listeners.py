"""What a recording window tells the parts of a profile that are not its recording: the spill (what is
complete, appended to a file while recording) and the ring (parts older than the last N seconds let
go). Each is a :class:`WindowListener`; the Profile calls its listeners at each point of a window and
knows nothing of what they do.

::

    listeners = listeners_for(spill_path, ring_s, header, warn)   # [(Ring)SpillListener, RingListener]
    for listener in listeners:
        listener.on_window_start(info)         # the training thread, as a window starts recording
        listener.on_parts(parts, sessions)     # a flush (background thread) or a dump handed parts over
        ended = listener.on_window_end()       # the training thread, as the window stops
        listener.on_collected(ended, parts, info)  # the writer, with every part of that window
        listener.on_trace_written()            # a trace of the profile is on disk
        listener.close(remove=False)           # the profile ended
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

from polyprof.formats.spill.names import PREVIOUS
from polyprof.merge import RING, RING_MB
from polyprof.model import CollectedPart
from polyprof.plugin.clock import host_ns


def process_identity() -> dict[str, Any]:
    """Who wrote a spill: polyprof's version, the process id, host name and command line."""
    import socket
    import sys

    from polyprof._version import __version__

    return {"version": __version__, "pid": os.getpid(), "host_name": socket.gethostname(), "argv": list(sys.argv)}


def listeners_for(
    spill_path: str | None, ring_s: float | None, spill_header: Callable[[], dict[str, Any]],
    warn: Callable[[str], None], ring_mb: float | None = None,
) -> list[WindowListener]:
    """The listeners a profile's options ask for: the spill, the ring, both or none."""
    listeners: list[WindowListener] = []
    if spill_path is not None and ring_s is not None:
        listeners.append(RingSpillListener(spill_path, ring_s, spill_header, warn))
    elif spill_path is not None:
        listeners.append(SpillListener(spill_path, spill_header, warn))
    if ring_s is not None:
        listeners.append(RingListener(ring_s, ring_mb))
    return listeners


class WindowListener:
    """The points of a recording window a listener may act on; each does nothing unless overridden."""

    def on_window_start(self, info: dict[str, Any]) -> None:
        """A window starts recording (`info`: its start, step, backends and those that flush)."""

    def on_parts(self, parts: list[CollectedPart], sessions: Any) -> None:
        """Parts handed over while recording (a flush, or a dump), with the window's sessions."""

    def on_window_end(self) -> Any:
        """The window stops recording (the training thread); what is returned comes back to
        :meth:`on_collected` for this window."""

    def on_collected(self, ended: Any, parts: list[CollectedPart], info: dict[str, Any]) -> None:
        """Every part of the window `ended` (on the writer, before the merge)."""

    def on_trace_written(self) -> None:
        """A trace of the profile has been written to a file."""

    def close(self, remove: bool) -> None:
        """The profile ended (`remove`: a trace of it is on disk)."""

    @property
    def wants_parts(self) -> bool:
        """Whether flushes should report their parts here while recording."""
        return False


class SpillListener(WindowListener):
    """The spill: each window noted as it starts, flushed parts appended as they come, the rest of a
    window's parts once collected; ended cleanly with the profile and removed once a trace is written.
    A spill that cannot be written is a warning (`warn`), never the user's exception."""

    def __init__(self, path: str, header: Callable[[], dict[str, Any]], warn: Callable[[str], None]) -> None:
        self.path, self.header, self.warn = path, header, warn
        self.spill: Any = None  # the writer while one is open
        self.left: str | None = None  # a spill ended cleanly, removed once a trace is written
        #: this window's parts already in the spill, by id while they live (a ring lets parts go, and a
        #: freed part's id may come back on a new one)
        self.spilled: dict[int, weakref.ref] = {}

    @property
    def wants_parts(self) -> bool:
        return self.spill is not None

    def on_window_start(self, info: dict[str, Any]) -> None:
        self._window_into_spill(info)

    def _window_into_spill(self, info: dict[str, Any]) -> None:
        """The window's start into the spill (opened first where none is open); a spill that cannot be
        written is let go with a warning."""
        from polyprof.formats.spill import open_spill

        try:
            if self.spill is None:
                self.spill = open_spill(self.path, {**process_identity(), **self.header()})
            self.spill.append_window(info)
        except OSError as exc:
            self.spill = None
            self.warn(f"polyprof: the spill {self.path} cannot be written ({exc.strerror or exc}); recording "
                      "goes on without it")

    def on_parts(self, parts: list[CollectedPart], sessions: Any) -> None:
        if self.spill is not None:
            self.spill.append_parts(parts)
            for p in parts:
                self.spilled[id(p)] = weakref.ref(p, lambda _, key=id(p), spilled=self.spilled: spilled.pop(key, None))

    def on_window_end(self) -> Any:
        spill, spilled, self.spilled = self.spill, self.spilled, {}
        if spill is not None:
            spill.window_ended()
        return spill, spilled

    def on_collected(self, ended: Any, parts: list[CollectedPart], info: dict[str, Any]) -> None:
        spill, spilled = ended
        if spill is None:  # the spill now holds the whole window: recoverable if the export fails
            return
        try:
            spill.window_collected([p for p in parts if id(p) not in spilled], info)
        except OSError as exc:
            raise OSError(f"the spill {spill.path} could not take the window's rows: {exc}") from exc

    def on_trace_written(self) -> None:
        self.close(remove=True)

    def close(self, remove: bool) -> None:
        spill, self.spill = self.spill, None
        if spill is not None:
            spill.close(clean=True, remove=remove)
        elif remove and self.left is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.left)
        self.left = None if remove else (spill.path if spill is not None else self.left)


class RingSpillListener(SpillListener):
    """The spill of a ring: on disk, what the ring holds. It is written in two generations, ``PATH`` and
    ``PATH.previous``: once ``PATH`` is older than the ring's seconds it becomes ``PATH.previous`` (the
    older one removed) and a new ``PATH`` starts with the window's start again, so that the files stay
    about two rings long and a process killed at any time leaves at least the ring's last seconds, less
    the rows not yet handed over."""

    def __init__(self, path: str, seconds: float, header: Callable[[], dict[str, Any]], warn: Callable[[str], None]) -> None:
        super().__init__(path, header, warn)
        self.seconds = seconds
        self._started_ns = 0
        self._window: dict[str, Any] | None = None

    def on_window_start(self, info: dict[str, Any]) -> None:
        self._window = info
        if self.spill is None:
            self._started_ns = host_ns()
        super().on_window_start(info)

    def on_parts(self, parts: list[CollectedPart], sessions: Any) -> None:
        super().on_parts(parts, sessions)
        if self.spill is not None and host_ns() - self._started_ns > self.seconds * 1e9:
            self._next_generation()

    def _next_generation(self) -> None:
        old, self.spill = self.spill, None
        old.close(clean=False)  # (not an end: the recording goes on in the next generation)
        try:
            os.replace(self.path, self.path + PREVIOUS)
        except OSError as exc:
            self.warn(f"polyprof: the spill {self.path} cannot be written ({exc.strerror or exc}); recording "
                      "goes on without it")
            return
        self._started_ns = host_ns()
        if self._window is not None:
            self._window_into_spill(self._window)

    def close(self, remove: bool) -> None:
        super().close(remove)
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path + PREVIOUS)


class RingListener(WindowListener):
    """Ring mode: after each flush, the parts whose rows all ended more than `seconds` ago are let go,
    counted on their backend's status (``dropped``, under :data:`RING`); with `megabytes`, the oldest
    parts too while those held take more (about: :func:`part_bytes`; each backend's newest part is
    kept), under :data:`RING_MB`."""

    def __init__(self, seconds: float, megabytes: float | None = None) -> None:
        self.seconds = seconds
        self.max_bytes = None if megabytes is None else int(megabytes * 1e6)
        self._sizes: dict[int, tuple[Any, int]] = {}  # id -> (a weak reference, part_bytes) of the parts held

    @property
    def wants_parts(self) -> bool:
        return True

    def on_parts(self, parts: list[CollectedPart], sessions: Any) -> None:
        if sessions is None:
            return
        oldest = host_ns() - int(self.seconds * 1e9)
        for h in sessions.handles:
            keep = []
            for p in h.parts:
                ends = p.activities["end"]
                if len(ends) and int(ends.max()) < oldest:
                    h.status.add_dropped(RING, len(ends))
                else:
                    keep.append(p)
            h.parts = keep
        if self.max_bytes is not None:
            self._cap(sessions.handles)

    def _cap(self, handles: list[Any]) -> None:
        """The oldest parts let go while the parts held take more than `max_bytes`; each backend's newest
        is kept (what the ring holds is then at most the cap and a hand-over's rows)."""
        def size(p: CollectedPart) -> tuple[Any, int]:  # (parts never change; an id of one let go is reused)
            known = self._sizes.get(id(p))
            return known if known is not None and known[0]() is p else (weakref.ref(p), part_bytes(p))

        self._sizes = {id(p): size(p) for h in handles for p in h.parts}  # (the parts let go are forgotten)
        held = [(int(p.activities["start"].min()) if len(p.activities) else 0, self._sizes[id(p)][1], h, p)
                for h in handles for p in h.parts]
        total = sum(size for _, size, _, _ in held)
        newest = {id(h.parts[-1]) for h in handles if h.parts}
        for _, size, h, p in sorted(held, key=lambda x: x[0]):
            if id(p) in newest:
                continue
            if total <= self.max_bytes:
                break
            h.parts = [q for q in h.parts if q is not p]
            h.status.add_dropped(RING_MB, len(p.activities))
            total -= size


def part_bytes(part: CollectedPart) -> int:
    """About what a part's rows hold in memory: its columns, its strings and its args."""
    acts = part.activities
    size = sum(column.nbytes for column in acts.columns.values())
    size += sum(len(s) + 49 for s in acts.strings.strings)  # (a str object's header and its text)
    size += 232 * len(acts.args.dicts)  # (a small dict)
    size += sum(getattr(c, "nbytes", 0) for block in acts.args.blocks for c in block.columns)
    return size
