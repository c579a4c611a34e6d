"""A file read in steps, and output written from a thread of its own: the byte plumbing of the streamed
rewrites (the rank merge's C rewriters), whose memory stays a few buffers whatever the file's size.

::

    from polyprof.formats.common.streaming import BackgroundWriter, feed

    with open("out.json", "wb") as out, BackgroundWriter(out) as sink:
        def step(data, final):                 # -> (bytes used, stop reading)
            sink.write(b",\n" + bytes(data))
            return len(data), False
        feed("rank0.json.gz", step)
"""

from __future__ import annotations

import queue
import threading
from typing import IO, Any

from polyprof.formats.common.source import open_stream

READ_BYTES = 4 << 20  # what the C rewriter is handed at a time: memory stays a few of these


def feed(path: str, step: Any) -> None:
    """The file at `path` (inflated), handed to ``step(data, final) -> (used, done)`` `READ_BYTES` at a
    time, read straight into one buffer: what `step` did not use comes again, with more, next time;
    `final` when nothing more comes; `done` stops the reading."""
    pending, filled = bytearray(2 * READ_BYTES), 0  # read, not yet used: pending[:filled]
    with open_stream(path) as stream:
        while True:
            if len(pending) < filled + READ_BYTES:  # an item longer than the buffer
                pending.extend(bytes(filled + READ_BYTES - len(pending)))
            with memoryview(pending) as view, view[filled : filled + READ_BYTES] as free:
                got = stream.readinto(free)
            filled += got
            with memoryview(pending) as view, view[:filled] as data:
                used, done = step(data, not got)
            if done or not got:
                return
            pending[: filled - used] = pending[used:filled]  # what is left of a cut item, to the front
            filled -= used


class BackgroundWriter:
    """Writes chunks that each start with `separator` (``,\\n`` between JSON events; all but the first
    kept) from a thread of its own, so that writing (and compressing) overlaps the rewriting; at most
    `depth` chunks wait. Use as a context manager: leaving it waits for the last write and raises what
    writing raised."""

    def __init__(self, out: IO[bytes], separator: bytes = b",\n", depth: int = 4,
                 name: str = "polyprof-merge-writer") -> None:
        self.out, self.first, self.error, self.skip = out, True, None, len(separator)
        self.queue: queue.Queue[bytes | None] = queue.Queue(depth)
        self.thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while (chunk := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.out.write(chunk)
                except BaseException as exc:  # handed to the merging thread at its next write
                    self.error = exc

    def write(self, chunk: bytes) -> None:
        if self.error is not None:
            raise self.error
        if chunk:
            self.queue.put(chunk[self.skip :] if self.first else chunk)
            self.first = False

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error
