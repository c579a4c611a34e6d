"""The protobuf wire format, as much of it as a trace writer and reader need: varints, tags,
length-delimited fields, fixed64 and doubles. Hand-written because the writer encodes straight from
columns (no message objects per event) and the reader walks only the fields it knows.

::

    field_varint(8, 1_000)                     # b"\\x40\\xe8\\x07"
    field_bytes(2, b"name")                    # tag, length, bytes
    for number, wire_type, value in fields(buf): ...
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")


def varint(value: int) -> bytes:
    """`value` as a base-128 varint (negative int64 values as their 10-byte two's complement)."""
    value &= _MASK64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint((number << 3) | wire_type)


def field_varint(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(int(value))


def field_bytes(number: int, value: bytes) -> bytes:
    return tag(number, LENGTH) + varint(len(value)) + value


def field_string(number: int, value: str) -> bytes:
    return field_bytes(number, value.encode("utf-8", "surrogatepass"))


def field_fixed64(number: int, value: int) -> bytes:
    return tag(number, FIXED64) + _FIXED64.pack(int(value) & _MASK64)


def field_double(number: int, value: float) -> bytes:
    return tag(number, FIXED64) + _DOUBLE.pack(float(value))


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`."""
    result = shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise WireError("a varint runs past the end of the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("a varint is longer than 10 bytes")


def fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes | memoryview]]:
    """(field number, wire type, value) of each field: an int for varints and fixed64/fixed32 (as
    unsigned), a memoryview for length-delimited fields."""
    view = memoryview(buf)
    pos, n = 0, len(view)
    while pos < n:
        key, pos = read_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, pos = read_varint(view, pos)
        elif wire_type == LENGTH:
            size, pos = read_varint(view, pos)
            if pos + size > n:
                raise WireError(f"field {number} is {size} bytes long, past the end of the message")
            value, pos = view[pos : pos + size], pos + size
        elif wire_type == FIXED64:
            if pos + 8 > n:
                raise WireError(f"field {number} (fixed64) runs past the end of the message")
            value, pos = _FIXED64.unpack_from(view, pos)[0], pos + 8
        elif wire_type == FIXED32:
            if pos + 4 > n:
                raise WireError(f"field {number} (fixed32) runs past the end of the message")
            value, pos = int.from_bytes(view[pos : pos + 4], "little"), pos + 4
        else:
            raise WireError(f"field {number} has wire type {wire_type}, which no trace uses")
        yield number, wire_type, value


def as_int64(value: int) -> int:
    """An unsigned 64-bit varint read back as the signed int64 it encodes."""
    return value - (1 << 64) if value >= 1 << 63 else value


def as_double(value: int) -> float:
    return _DOUBLE.unpack(_FIXED64.pack(value))[0]
