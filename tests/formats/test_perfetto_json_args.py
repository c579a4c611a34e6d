"""Args kept as JSON text (a trace read back) are encoded as Perfetto debug annotations in C, byte for
byte what the Python encoder writes for the decoded values, or left to it."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

import polyprof._native
from polyprof.formats.perfetto.write import Interned, annotations

fast = polyprof._native.extension
pytestmark = pytest.mark.skipif(fast is None, reason="needs polyprof's C extension (built by setup.sh)")

ENCODED_IN_C = [b"0", b"-7", b"9223372036854775807", b"-9223372036854775808", b"1.5", b"-2.5e-3", b" 3.25 ",
                b"true", b"false", b"null", b'""', b'"aten::mm"', b'"tab\\tquote\\" slash\\/ back\\\\"',
                b"[]", b"{}", b'[[8, 16], [32, 16], [1]]', b'["", "", "x"]', b'{"a": [1, -2], "b": null}']
LEFT_TO_PYTHON = [b"9223372036854775808", b'"\\u00e9"', "\"caf\u00e9\"".encode(), b"[1.5, 2]", b'["\\n"]',
                  b"[123456789012345678901]", b"1e400"]


def test_json_values_encode_exactly_as_decoded_values_do():
    interned = Interned()
    iid = interned.iid("value")
    values = ENCODED_IN_C + LEFT_TO_PYTHON
    blobs: list[bytes | None] = [None] * len(values)
    left = fast.encode_json_args(np.arange(len(values), dtype=np.int64), (iid,), [values], blobs)
    assert left == list(range(len(ENCODED_IN_C), len(values))), "exactly the values Python must write"
    for value, blob in zip(ENCODED_IN_C, blobs, strict=False):
        assert blob == annotations({"value": orjson.loads(value)}, interned), value
    assert all(b is None for b in blobs[len(ENCODED_IN_C):])


def test_random_blocks_match_the_python_encoder():
    rng = random.Random(5)
    interned = Interned()
    keys = ("Input Dims", "Sequence number", "name", "flag")
    iids = tuple(interned.iid(k) for k in keys)
    n = 500
    columns = [
        [orjson.dumps([[rng.randrange(64) for _ in range(rng.randrange(3))] for _ in range(rng.randrange(4))]) for _ in range(n)],
        [str(rng.randrange(-(2**40), 2**40)).encode() for _ in range(n)],
        [orjson.dumps(rng.choice(["aten::add", "a\\b", 'q"', "x" * rng.randrange(30)])) for _ in range(n)],
        [rng.choice([b"true", b"false", b""]) for _ in range(n)],  # b"": the row has no such key
    ]
    rows = np.array(sorted(rng.sample(range(2 * n), n)), dtype=np.int64)
    blobs: list[bytes | None] = [None] * (2 * n)
    assert fast.encode_json_args(rows, iids, columns, blobs) == []
    for p, row in enumerate(rows.tolist()):
        args = {k: orjson.loads(c[p]) for k, c in zip(keys, columns, strict=True) if c[p]}
        assert blobs[row] == annotations(args, interned)
    assert sum(b is None for b in blobs) == n, "rows outside the block untouched"


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="one column per name"):
        fast.encode_json_args(np.zeros(1, np.int64), (1, 2), [[b"1"]], [None])
    with pytest.raises(ValueError, match="a row outside the blobs"):
        fast.encode_json_args(np.array([3], np.int64), (1,), [[b"1"]], [None])
