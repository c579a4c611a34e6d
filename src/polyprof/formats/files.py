"""Trace files by their bytes (reading) and by their path (writing): the one place that chooses a
format.

::

    trace = load_trace("rank0.json.gz")      # Chrome JSON or Perfetto, gzip or not: told by the bytes
    trace = parse_trace(data, "name")        # the same from bytes in memory
    for chunk in open_chunks("rank0.json.gz", rows=50_000):   # any size, in bounded memory
        chunk.trace                           # a partial trace (see polyprof.formats.common.chunk)

:func:`open_chunks` is the one way a trace's rows are read a chunk at a time, whatever the source: a
trace file (Chrome JSON, Perfetto) or what a killed run left (a spill, a Perfetto spill), read as
``polyprof recover`` reads it. Each format's reader gives the one :class:`Chunk`; where a C scanner
declines, the reference reader reads on inside the stream (its first chunk says it restarted), so no
caller has a second path.

Which writer a trace path asks for (:func:`~polyprof.formats.common.paths.format_of`): Perfetto protobuf for ``.pftrace`` / ``.perfetto-trace`` (and
``.gz`` after either), the trace store (:mod:`polyprof.store`) for a ``.polyprof`` folder, where each
rank adds its own tables, Kineto-dialect Chrome JSON for everything else.

::

    write_trace(trace, "t.pftrace")          # Perfetto
    write_trace(trace, "t.json.gz")          # Chrome JSON, gzip
    write_trace(trace, "t.bin", format="perfetto")
    write_trace(trace, "job.polyprof")       # this rank's tables into the store (made if missing)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from polyprof.errors import TraceFormatError
from polyprof.formats.common.paths import format_of
from polyprof.formats.common.source import (
    first_bytes,
    inflate,
    is_gzip_file,
    max_trace_bytes,
    max_value_bytes,
    trace_chunks,
)

if TYPE_CHECKING:
    from polyprof.formats.common.chunk import Chunk

def write_trace(trace: Any, path: str | os.PathLike, format: str | None = None) -> str:
    """Write `trace` in the format its path (or `format`) names; returns the path written."""
    chosen = format_of(path, format)
    if chosen == "store":
        from polyprof.formats.store.files import add_rank

        return add_rank(trace, path)
    if chosen == "perfetto":
        from polyprof.formats.perfetto.write import write_perfetto_trace

        return write_perfetto_trace(trace, path)
    from polyprof.formats.chrome.write import write_chrome_trace

    return write_chrome_trace(trace, path)


#: read at a time by load_trace: what a Perfetto file's scan holds of the file
PIECE = 1 << 20


def load_trace(path: str | os.PathLike, *, max_bytes: int | None = None) -> Any:
    """Load a trace file into a :class:`~polyprof.model.Trace`: Chrome trace JSON (polyprof's or
    torch.profiler's) or Perfetto protobuf (``.pftrace``), either one gzip-compressed or not, told apart
    by their bytes. Anything wrong with the file is a TraceFormatError naming the file and the problem,
    in one line; so is a file over `max_bytes` (POLYPROF_MAX_TRACE_BYTES, 8 GiB) or, for gzip JSON, one
    holding a token over POLYPROF_MAX_VALUE_BYTES (64 MiB), refused in bounded memory."""
    from polyprof.formats.chrome import read as chrome_read
    from polyprof.formats.perfetto.read import looks_like_perfetto

    path = os.fspath(path)
    limit = max_bytes or max_trace_bytes()
    scanned = chrome_read.scanned_file(path, limit)
    if scanned is not None:
        return scanned
    chunks = trace_chunks(path, limit, PIECE)
    data = first_bytes(chunks, 1)  # the first piece tells Perfetto from JSON
    refuse_spill(data, path)
    if looks_like_perfetto(data):
        pieces = itertools.chain((data,), chunks)
        del data  # the scan lets each piece go once read
        return _perfetto_file(path, pieces, limit)
    token_limit = max_value_bytes()
    if len(data) <= token_limit:
        data += first_bytes(chunks, token_limit + 1 - len(data))
    if len(data) > token_limit:  # large JSON the scanner did not read
        chunks.close()
        del data
        if is_gzip_file(path):  # one token of gigabytes (a gzip bomb) is refused before reading
            chrome_read.check_tokens(trace_chunks(path, limit), path)
        return chrome_read.read_streamed(path)
    try:
        return parse_trace(data + b"".join(chunks), path)
    except MemoryError:
        raise TraceFormatError(f"{path}: there is not enough memory to read it ({os.path.getsize(path):,} bytes)") from None


def open_chunks(path: str | os.PathLike, rows: int | None = None, *,
                on_read: Callable[[int], None] | None = None) -> Iterator[Chunk]:
    """The rows of the trace, spill or Perfetto spill at `path` (gzip or not: told by its bytes, a
    Perfetto spill by its name) in chunks of about `rows` rows, or with `rows` None as one chunk, the
    whole trace (:func:`load_trace`'s, or :func:`~polyprof.formats.spill.recover.recover_trace`'s for
    what a killed run left). `on_read` is told the file's bytes read so far (on disk) as the chunks are
    read (from 0 again where a reading restarts)."""
    from polyprof.formats.common.chunk import falling_back, whole
    from polyprof.formats.perfetto.read import is_perfetto_file
    from polyprof.formats.spill.names import is_perfetto_spill, is_spill_file

    path = os.fspath(path)
    ours = is_spill_file(path)  # (read once: it opens the file)
    if ours or is_perfetto_spill(path):
        from polyprof.formats.spill.recover import recover_trace
        from polyprof.formats.spill.recover_stream import perfetto_spill_chunks, recover_pieces

        whole_file = whole(lambda: recover_trace(path))
        spill = recover_pieces if ours else perfetto_spill_chunks
        return iter(whole_file()) if rows is None else falling_back(lambda: spill(path, rows, on_read), whole_file)
    whole_file = whole(lambda: load_trace(path))
    if rows is None:
        return iter(whole_file())
    if is_perfetto_file(path):
        from polyprof.formats.perfetto.chunks import perfetto_chunks

        return falling_back(lambda: perfetto_chunks(path, rows, on_read), whole_file)
    from polyprof.formats.chrome.read import json_chunks

    return json_chunks(path, rows, on_read)


def refuse_spill(data: bytes, path: str) -> None:
    """A TraceFormatError saying how to read it where `data` starts a spill (a trace's reader would call
    it malformed JSON)."""
    from polyprof.formats.spill.names import FILE_MAGIC

    if data.startswith(FILE_MAGIC):
        raise TraceFormatError(f"{path}: a polyprof spill (what a run killed before it wrote its trace leaves), "
                               f"not a trace: `polyprof recover {path}` writes its trace")


def _perfetto_file(path: str, pieces: Iterator[bytes], limit: int) -> Any:
    """A Perfetto file scanned as it is read (its bytes never held whole), or, where the scanner
    declines, read whole by the reference reader, which names what is wrong (and, for a Perfetto spill,
    how to read one that a kill cut short)."""
    from polyprof.formats.perfetto.read import parse_perfetto
    from polyprof.formats.perfetto.scan import scan_perfetto_pieces
    from polyprof.formats.spill.names import is_perfetto_spill

    try:
        scanned = scan_perfetto_pieces(pieces, path)
        if scanned is not None:
            return scanned
        return parse_perfetto(b"".join(trace_chunks(path, limit)), path)
    except MemoryError:
        raise TraceFormatError(f"{path}: there is not enough memory to read it ({os.path.getsize(path):,} bytes)") from None
    except TraceFormatError as exc:
        if not is_perfetto_spill(path):
            raise
        raise TraceFormatError(f"{exc} (a spill a kill cut short: `polyprof recover {path}` reads it)") from None


def parse_trace(data: bytes, path: str = "<trace>") -> Any:
    """A trace from its bytes, Chrome JSON or Perfetto protobuf, gzip or not (`path` names it in errors)."""
    from polyprof.formats.chrome.read import parse_json
    from polyprof.formats.perfetto.read import looks_like_perfetto, parse_perfetto
    from polyprof.formats.perfetto.scan import scan_perfetto

    if data[:2] == b"\x1f\x8b":
        data = inflate(data, path, max_trace_bytes())
    refuse_spill(data, path)
    if looks_like_perfetto(data):
        scanned = scan_perfetto(data, path)  # columns straight from the packets, or None: the reader's
        return scanned if scanned is not None else parse_perfetto(data, path)
    return parse_json(data, path)
