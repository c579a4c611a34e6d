"""The reader cannot be crashed: mutated traces (polyprof's and torch.profiler's) from a fixed seed give a
trace or a one-line TraceFormatError, nothing else; special files and inflation bombs are refused."""

import copy
import gzip
import json
import os
import random
import time

import orjson
import pytest
from fake_backends import SimDeviceBackend

import polyprof
from polyprof.analysis import summarize
from polyprof.errors import TraceFormatError
from polyprof.formats import dumps_chrome_trace, load_trace
from polyprof.formats.files import parse_trace

MUTATIONS = 1200
ODD_VALUES = [None, True, False, -1, 0, 2**70, -(2**70), 1e300, -1e300, 0.5, "", "x" * 50, "12.5", [], {}, [1, [2]],
              {"a": {"b": []}}, [None], {"": None}]


def _polyprof_doc(registry) -> dict:
    sim = SimDeviceBackend()
    registry.register(sim)
    with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
        for i in range(5):
            with polyprof.record_function(f"step {i}", {"i": i}):
                sim.launch(f"k{i}")
            polyprof.instant("mark")
            polyprof.counter("depth", i)
    return orjson.loads(dumps_chrome_trace(prof.trace))


def _torch_doc() -> dict | None:
    torch = pytest.importorskip("torch", reason="needs torch to write a torch.profiler trace")
    import tempfile

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as p:
        with torch.profiler.record_function("outer"):
            torch.ones(4).add(1).sum()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    p.export_chrome_trace(path)
    with open(path, "rb") as f:
        doc = orjson.loads(f.read())
    os.unlink(path)
    return doc


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(doc: dict, rng: random.Random) -> bytes:
    if rng.random() < 0.25:  # byte-level: truncation or flipped bytes
        data = bytearray(json.dumps(doc).encode())
        if rng.random() < 0.5:
            return bytes(data[: rng.randrange(len(data))])
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    for _ in range(rng.randrange(1, 4)):
        path = rng.choice(paths)
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if rng.random() < 0.2 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
        except (KeyError, IndexError, TypeError):  # an earlier mutation changed the shape
            continue
    return json.dumps(doc).encode()  # the standard library writes integers of any size


def test_mutated_traces_give_a_trace_or_a_one_line_error(registry):
    bases = [_polyprof_doc(registry), _torch_doc()]
    rng = random.Random(20261201)
    started, errors, loaded = time.monotonic(), 0, 0
    for i in range(MUTATIONS):
        data = _mutate(bases[i % 2], rng)
        try:
            trace = parse_trace(data, f"mutant{i}.json")
            dumps_chrome_trace(trace)  # and what was read can be written again, and summarised
            summarize(trace)
            loaded += 1
        except TraceFormatError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"mutant{i}.json: ")
            errors += 1
    assert errors + loaded == MUTATIONS and errors > 100 and loaded > 100
    assert time.monotonic() - started < 60


def test_special_files_and_inflation_bombs_are_refused(tmp_path, monkeypatch):
    with pytest.raises(TraceFormatError, match="not a regular file"):
        load_trace("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError, match="not a regular file"):
        load_trace(fifo)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (20 << 20)))  # 20 MB of spaces in ~20 KB
    with pytest.raises(TraceFormatError, match="inflates to over 1,048,576 bytes"):
        load_trace(bomb, max_bytes=1 << 20)
    monkeypatch.setenv("POLYPROF_MAX_TRACE_BYTES", str(1 << 20))
    with pytest.raises(TraceFormatError, match="POLYPROF_MAX_TRACE_BYTES"):
        load_trace(bomb)
