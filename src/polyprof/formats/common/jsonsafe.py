"""JSON for any value a user or backend handed over: what JSON can hold is written as it is; the rest is
made representable, never an error (a trace is not lost to one odd value)::

    json_bytes({"shape": (2, 3), ("a", 1): object(), "n": 2**70, "s": "\\udc80"})
    # -> b'{"shape":[2,3],"(\\'a\\', 1)":"<object object at ...>","n":"1180591620717411303424","s":"\\ufffd"}'

- strings with lone surrogates get U+FFFD in their place;
- keys that are not strings (tuples, objects) become their repr (ints, floats, bools stay JSON keys);
- integers beyond 64 bits become decimal strings; NaN and infinities null;
- anything else (objects, sets, bytes) its repr, or a list for sets and tuples.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
_KEY_TYPES = (str, int, float, bool)
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_bytes(value: Any) -> bytes:
    """`value` as JSON (UTF-8 bytes), made representable where it is not."""
    try:
        return orjson.dumps(value, option=OPTIONS)
    except (TypeError, orjson.JSONEncodeError):  # JSONEncodeError is a TypeError; both named for clarity
        return orjson.dumps(representable(value), option=OPTIONS)


def json_text(value: Any) -> str:
    return json_bytes(value).decode()


def safe_str(s: str) -> str:
    """`s` with any lone surrogate replaced by U+FFFD (so it encodes as UTF-8)."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", s)


def representable(value: Any, depth: int = 0) -> Any:
    """A copy of `value` that orjson can write (see the module docstring)."""
    if depth > 64:  # a structure this deep (or a cycle): its repr, cut short
        return repr(value)[:200]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return safe_str(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_key(k): representable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [representable(v, depth + 1) for v in value]
    try:  # numpy scalars and arrays, datetimes...: what orjson takes as it is
        orjson.dumps(value, option=OPTIONS)
        return value
    except (TypeError, orjson.JSONEncodeError):
        return safe_str(_repr(value))


def _key(key: Any) -> Any:
    if isinstance(key, str):
        return safe_str(key)
    if isinstance(key, _KEY_TYPES) and not (isinstance(key, int) and not -(2**63) <= key < 2**64):
        return key
    return safe_str(_repr(key))


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a repr that raises
        return f"<{type(value).__name__}>"
