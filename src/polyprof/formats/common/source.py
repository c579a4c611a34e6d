"""A trace file's bytes, read within limits: every reader takes them from here.

::

    data = read_bytes("rank0.json.gz", max_trace_bytes())          # the whole file, inflated
    for chunk in trace_chunks("rank0.json.gz", max_trace_bytes()):  # or a step at a time
        ...
    tokens = TokenBound(chunks, "rank0.json.gz")                    # a stream for ijson, one token at most
                                                                    # max_value_bytes() long

Two limits keep a hostile or broken file an error rather than an out-of-memory kill: the whole file
(after gzip inflation) and, for gzip JSON checked as a stream before it is read, one token (a string, a
number, a run of blanks).
A gzip bomb of 1 MB that inflates to one 1 GB string is refused at the second, having held at most
that limit of it.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections.abc import Iterator
from typing import IO, Any

from polyprof.errors import TraceFormatError

#: the largest trace read (file, and after gzip inflation), so that a device file or a gzip bomb is an
#: error, not an out-of-memory kill; POLYPROF_MAX_TRACE_BYTES or ``load_trace(..., max_bytes=)`` raise it
DEFAULT_MAX_TRACE_BYTES = 8 << 30
#: the longest single JSON token a streamed read holds (no real trace has a string near it)
DEFAULT_MAX_VALUE_BYTES = 64 << 20
#: read and inflated at most this much per step (the limits are checked between steps)
STEP = 16 << 20

_RAISE_IT = "set POLYPROF_MAX_TRACE_BYTES or max_bytes= to read it"


def _limit(variable: str, default: int) -> int:
    try:
        return int(os.environ.get(variable, default))
    except ValueError:
        return default


def max_trace_bytes() -> int:
    """The whole-file limit: POLYPROF_MAX_TRACE_BYTES, else 8 GiB."""
    return _limit("POLYPROF_MAX_TRACE_BYTES", DEFAULT_MAX_TRACE_BYTES)


def max_value_bytes() -> int:
    """The one-token limit of a streamed read: POLYPROF_MAX_VALUE_BYTES, else 64 MiB."""
    return _limit("POLYPROF_MAX_VALUE_BYTES", DEFAULT_MAX_VALUE_BYTES)


def trace_chunks(path: str, max_bytes: int, step: int = STEP) -> Iterator[bytes]:
    """The file's bytes, inflated where it is gzip, in steps of at most `step` bytes; a TraceFormatError
    (on the first ``next``) for a file that is missing, special or over `max_bytes`, before or after
    inflation."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise TraceFormatError(f"{path}: is a directory, not a trace file")
        if not stat.S_ISREG(info.st_mode):
            raise TraceFormatError(f"{path}: is not a regular file (a device, FIFO or socket is not read)")
        if info.st_size > max_bytes:
            raise TraceFormatError(f"{path}: {info.st_size:,} bytes is over the limit of {max_bytes:,} ({_RAISE_IT})")
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            if gzipped:
                yield from inflated(f, path, max_bytes, step)
                return
            chunk = f.read(min(info.st_size, step) + 1)  # what the size says: a small file in one read
            size = len(chunk)
            while chunk:
                if size > max_bytes:
                    raise TraceFormatError(f"{path}: over the limit of {max_bytes:,} bytes ({_RAISE_IT})")
                yield chunk
                chunk = f.read(step)
                size += len(chunk)
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_bytes(path: str, max_bytes: int) -> bytes:
    """The whole file, inflated where it is gzip (see :func:`trace_chunks` for its errors)."""
    return b"".join(trace_chunks(path, max_bytes))


def inflate(data: bytes, path: str, max_bytes: int) -> bytes:
    """gzip `data` (possibly several members), inflated to at most `max_bytes`."""
    return b"".join(inflated(io.BytesIO(data), path, max_bytes))


def inflated(f: Any, path: str, max_bytes: int, step: int = STEP) -> Iterator[bytes]:
    """The gzip stream `f` (its ``read(n)``; several members, zero padding between) inflated one step at
    a time: the limit is checked before the next step allocates."""
    size = 0
    inflater = None
    pending = b""
    try:
        while True:
            if not pending:
                pending = f.read(step)
                if not pending:
                    break
            if inflater is None:
                pending = pending.lstrip(b"\x00")
                if not pending:
                    continue
                inflater = zlib.decompressobj(wbits=31)
            chunk = inflater.decompress(pending, min(step, max_bytes + 1 - size))
            pending = inflater.unconsumed_tail
            if chunk:
                size += len(chunk)
                if size > max_bytes:
                    raise TraceFormatError(f"{path}: inflates to over {max_bytes:,} bytes ({_RAISE_IT})")
                yield chunk
            if inflater.eof:
                pending = inflater.unused_data
                inflater = None
    except zlib.error as exc:
        raise TraceFormatError(f"{path}: gzip data is truncated or corrupt ({exc})") from None
    if inflater is not None:
        raise TraceFormatError(f"{path}: gzip data is truncated or corrupt (unexpected end)")


def first_bytes(chunks: Any, at_least: int) -> bytes:
    """The first chunks of `chunks` until at least `at_least` bytes (all of them when fewer), joined."""
    parts = []
    size = 0
    for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size >= at_least:
            break
    return b"".join(parts)


def is_gzip_file(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_stream(path: str) -> IO[bytes]:
    """The file as a stream of its bytes, inflated when it is gzip (a TraceFormatError when it cannot be
    read): for readers that stream (ijson, the rewriters), which bound what they hold themselves."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    raw.seek(0)
    return raw


def disk_position(stream: IO[bytes]) -> int:
    """How far into its file on disk a stream from :func:`open_stream` (or ``gzip.open``) has read:
    for progress, where a gzip stream's inflated position says nothing of the file's size."""
    return int(getattr(stream, "fileobj", stream).tell())


class TokenBound:
    """A byte stream over `chunks` for ijson (``read``) that refuses, as a TraceFormatError, to hold
    more than `max_value` bytes since the last token ijson gave: wrap its events in :meth:`tokens`.

    ::

        source = TokenBound(chunks, path)
        doc = dict(ijson.kvitems(source.tokens(ijson.parse(source, use_float=True)), ""))
    """

    def __init__(self, chunks: Iterator[bytes], path: str, max_value: int | None = None) -> None:
        self.chunks, self.path = chunks, path
        self.max_value = max_value or max_value_bytes()
        self.pending = b""
        self.at = 0
        self.position = 0
        self.mark = 0

    def read(self, n: int) -> bytes:
        if self.at >= len(self.pending):
            self.pending, self.at = next(self.chunks, b""), 0
        out = self.pending[self.at : self.at + n]
        self.at += len(out)
        if self.position - self.mark > self.max_value:  # (what ijson asked for before: one read more)
            raise TraceFormatError(
                f"{self.path}: one JSON token (a string, a number or a run of blanks) before byte "
                f"{self.position:,} is over {self.max_value:,} bytes: no trace holds one this long (a gzip "
                f"bomb?); set POLYPROF_MAX_VALUE_BYTES to read it"
            )
        self.position += len(out)
        return out

    def tokens(self, events: Iterator[Any]) -> Iterator[Any]:
        for event in events:
            self.mark = self.position
            yield event
