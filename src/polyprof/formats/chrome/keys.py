"""The top-level keys of a Chrome-trace JSON file other than its ``traceEvents``, read from the head and
the tail of the file without reading the events between: what a reader that streams the events, or a
converter, needs of the rest::

    keys = top_level_keys("big.json.gz")     # {"schemaVersion": 1, "distributedInfo": {...}, ...}
"""

from __future__ import annotations

import gzip
import os
from typing import Any

import orjson

from polyprof.formats.common.source import open_stream

EDGE_BYTES = 4 << 20  # how much of the head and the tail is searched for the top-level keys


def top_level_keys(path: str) -> dict[str, Any]:
    """The top-level keys of a trace JSON other than ``traceEvents``, from the head of the file (the
    keys before it) and its tail (those after it), without reading what lies between."""
    with open_stream(path) as f:
        head = f.read(EDGE_BYTES)
        tail = head[-EDGE_BYTES:]
        if not isinstance(f, gzip.GzipFile):  # a plain file seeks to its tail
            size = os.fstat(f.fileno()).st_size
            if size > 2 * EDGE_BYTES:
                f.seek(size - EDGE_BYTES)
                tail = b""
        while True:  # to the end: a gzip stream cannot seek there
            block = f.read(EDGE_BYTES)
            if not block:
                break
            tail = (tail + block)[-EDGE_BYTES:]
    start = head.lstrip()
    if not start.startswith(b"{"):
        return {}  # the bare-array form has no keys
    keys: dict[str, Any] = {}
    at = head.find(b'"traceEvents"')
    if at > 0:
        before = head[:at].rstrip().rstrip(b",")
        try:
            parsed = orjson.loads(before + b"}")
            keys.update(parsed if isinstance(parsed, dict) else {})
        except orjson.JSONDecodeError:
            pass
    keys.update(_keys_after_events(tail))
    return keys


def _keys_after_events(tail: bytes) -> dict[str, Any]:
    """The keys after the traceEvents array, from the end of the file. The array's closing bracket is
    the leftmost "]" after which the rest reads as ", key: value ... }" (a "]" further right, inside a
    later value, may read too; one inside the events never does). Searched in the last 64 KB first, where
    it nearly always is, then in more."""
    for size in (1 << 16, 1 << 20, len(tail)):
        region = tail[-size:]
        end, after = len(region), None
        for _ in range(4096):
            end = region.rfind(b"]", 0, end)
            if end < 0:
                break
            rest = region[end + 1 :].strip()
            if not rest.startswith((b",", b"}")):
                continue  # what follows the array is "," or the closing "}"
            try:
                parsed = orjson.loads(b"{" + rest.lstrip(b",") if rest != b"}" else b"{}")
            except orjson.JSONDecodeError:
                continue
            if isinstance(parsed, dict):
                after = parsed
        if after is not None or size >= len(tail):
            return after or {}
    return {}
