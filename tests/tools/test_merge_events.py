"""`polyprof merge` JSON to JSON: the C rewriter (merge_events.c) against its pure-Python twin, on
traces written the way other tools write them (whitespace anywhere, string pids, escapes, nested
args, the bare-array form, gzip), cut at every chunk boundary, and on broken files."""

import gzip
import json
import random

import orjson
import pytest
from native_sides import use_python_side

import polyprof._native
from polyprof.errors import TraceFormatError
from polyprof.formats.common import streaming
from polyprof.tools import merge_ranks as ranks
from polyprof.tools.merge_ranks import ID_STRIDE, merge_traces

pytestmark = pytest.mark.skipif(polyprof._native.extension is None, reason="needs polyprof's C extension (built by setup.sh)")

ODD_RANK1 = b"""{ "distributedInfo" : {"backend": "gloo", "rank": 1, "world_size": 2},
 "deviceProperties": [{"name": "a ] tricky { name"}],
 "polyprof": {"backends": {"torch": {"clock": {"to rank 0": {"offset_ns": -2500, "uncertainty_ns": 40}}}}},
 "baseTimeNanoseconds": 1000000,
 "traceEvents"
   :
 [
  {"name": "process_name", "ph": "M", "pid": "worker", "tid": 0, "args": {"name": "the \\"worker\\""}},
  { "ph" : "X" , "name" : "a \\"quoted\\" \\\\ name {x}", "pid" : "worker", "tid" : 7,
    "ts" : 10.5 , "dur" : 2, "args" : {"nested": {"correlation": 5, "list": [1, {"External id": 9}]},
    "External id": 12, "correlation": 0, "text": "\\u00e9]"}},
  {"ph":"s","id":3,"pid":"worker","tid":7,"ts":11,"cat":"ac2g","name":"ac2g"},
  {"ph":"f","id":3,"pid":7,"tid":1,"ts":12.25,"cat":"ac2g","name":"ac2g","bp":"e"},
  {"ph":"s","id":"0x1f","pid":7,"tid":1,"ts":1.5e1,"cat":"fwdbwd","name":"fwdbwd"},
  {"ph":"X","name":"negative","pid":7,"tid":1,"ts":-1.001,"dur":0.5,"args":{"correlation":-4}},
  {"ph":"i","s":"t","name":"mark","pid":7,"tid":1,"ts":20},
  {"ph":"C","name":"mem","pid":7,"tid":0,"ts":21,"args":{"bytes":1e9}},
  {"ph":"X","cat":"Trace","name":"PyTorch Profiler (0)","pid":"Spans","tid":"PyTorch Profiler","ts":1,"dur":3},
  {"ph":"i","s":"g","name":"Record Window End","pid":"","tid":"","ts":30},
  {"ph":"X","name":"no pid","tid":1,"ts":3,"dur":1},
  17, [1, 2], "not an event"
 ],
 "traceName": "odd"
}
"""

RANK0 = {
    "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
    "baseTimeNanoseconds": 2000000,
    "traceEvents": [
        {"ph": "X", "name": "aten::mm", "pid": 10, "tid": 10, "ts": 1.0, "dur": 5.0, "args": {"External id": 1}},
        {"ph": "s", "id": 3, "pid": 10, "tid": 10, "ts": 1.0, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 3, "pid": 0, "tid": 7, "ts": 2.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"name": "process_labels", "ph": "M", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
    ],
}


def _merge(paths, out, pure, monkeypatch, read_bytes=None):
    with monkeypatch.context() as m:
        if pure:
            use_python_side(m)
        if read_bytes:
            m.setattr(streaming, "READ_BYTES", read_bytes)
        stats = merge_traces(paths, out)
    return stats, orjson.loads(out.read_bytes())


def _normal(doc):
    """The merged events, ts rounded as the twin writes them (the C path shifts decimals exactly)."""
    return [{**e, "ts": round(e["ts"], 3)} if isinstance(e.get("ts"), float) else e for e in doc["traceEvents"]]


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "odd1.json").write_bytes(ODD_RANK1)
    with gzip.open(tmp_path / "plain0.json.gz", "wb") as f:
        f.write(json.dumps(RANK0, indent=2).encode())
    return [tmp_path / "plain0.json.gz", tmp_path / "odd1.json"]


def test_the_c_rewriter_gives_the_twins_events(inputs, tmp_path, monkeypatch):
    stats_c, fast = _merge(inputs, tmp_path / "c.json", False, monkeypatch)
    stats_py, twin = _merge(inputs, tmp_path / "py.json", True, monkeypatch)
    assert _normal(fast) == _normal(twin) and stats_c.events == stats_py.events == 5
    assert fast["ranks"] == twin["ranks"]


def test_the_rewrite_places_each_event_on_the_merged_timeline(inputs, tmp_path, monkeypatch):
    _, doc = _merge(inputs, tmp_path / "c.json", False, monkeypatch)
    events = doc["traceEvents"]
    by_name = {e["name"]: e for e in events if e.get("ph") == "X"}
    quoted = by_name['a "quoted" \\ name {x}']
    # rank 1: base 1 ms and offset -2.5 us on a merged base of 0 (base_time_ns rounds down) -> +997.5 us
    assert quoted["ts"] == 1008.0 and quoted["dur"] == 2 and quoted["pid"] == 2 * ranks.PID_STRIDE
    assert quoted["args"]["External id"] == 12 + ID_STRIDE and quoted["args"]["correlation"] == 0, "zero is no id"
    assert quoted["args"]["nested"] == {"correlation": 5, "list": [1, {"External id": 9}]}, "only the args' own keys"
    assert quoted["args"]["text"] == "\u00e9]"
    assert by_name["negative"]["ts"] == 996.499 and by_name["negative"]["args"]["correlation"] == -4 + ID_STRIDE
    assert by_name["aten::mm"]["ts"] == 2001.0, "rank 0's base is 2 ms"
    flows = sorted((e["ph"], e["id"], e["pid"]) for e in events if e.get("cat") == "ac2g")
    assert flows == [("f", 3, 1001), ("f", 3 + ID_STRIDE, 2001), ("s", 3, 1000), ("s", 3 + ID_STRIDE, 2000)]
    assert [e["id"] for e in events if e.get("cat") == "fwdbwd"] == ["0x1f"], "a string id is kept"
    assert not [e for e in events if e.get("cat") == "Trace" or e.get("s") == "g"], "no per-rank envelope"
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {1000: "rank 0 · process 10", 1001: "rank 0 · GPU 0", 2000: 'rank 1 · the "worker"', 2001: "rank 1 · process 7"}
    assert "pid" not in by_name["no pid"]
    assert [r["clock_offset_ns"] for r in doc["ranks"]] == [None, -2500]


@pytest.mark.parametrize("read_bytes", [1, 7, 64, 1000])
def test_every_chunk_boundary_gives_the_same_merge(inputs, tmp_path, monkeypatch, read_bytes):
    _, whole = _merge(inputs, tmp_path / "a.json", False, monkeypatch)
    _, cut = _merge(inputs, tmp_path / "b.json", False, monkeypatch, read_bytes=read_bytes)
    assert cut["traceEvents"] == whole["traceEvents"]


def _random_event(rnd):
    ph = rnd.choice("XXXsfiMC")
    ev = {"ph": ph, "name": rnd.choice(["op", 'q"uote', "back\\slash", "uni\u00e9", "[br{ack}et]"]),
          "pid": rnd.choice([1, 2, "str pid", 0]), "tid": rnd.randrange(5), "ts": rnd.randrange(10**9) / 1000}
    if ph == "X":
        ev["dur"] = rnd.randrange(10**6) / 1000
        ev["args"] = {k: rnd.randrange(-3, 100) for k in rnd.sample(["External id", "correlation", "other"], 2)}
    elif ph in "sf":
        ev.update(id=rnd.choice([rnd.randrange(1, 50), "0xab"]), cat="ac2g")
    elif ph == "M":
        ev["name"] = rnd.choice(["process_name", "thread_name", "process_labels", "process_sort_index"])
        ev["args"] = {"name": "p", "labels": "L", "sort_index": 3}
    keys = list(ev)
    rnd.shuffle(keys)
    return {k: ev[k] for k in keys}


def test_random_traces_merge_the_same_through_c_and_the_twin(tmp_path, monkeypatch):
    rnd = random.Random(1616)
    for case in range(20):
        paths = []
        for r in range(3):
            doc = {"distributedInfo": {"rank": r}, "baseTimeNanoseconds": rnd.randrange(10**9),
                   "traceEvents": [_random_event(rnd) for _ in range(rnd.randrange(0, 60))]}
            text = json.dumps(doc, indent=rnd.choice([None, 1]), separators=rnd.choice([None, (",", ":"), (" , ", " : ")]))
            paths.append(tmp_path / f"c{case}r{r}.json")
            paths[-1].write_text(text)
        _, fast = _merge(paths, tmp_path / "c.json", False, monkeypatch, read_bytes=rnd.choice([None, 3, 50]))
        _, twin = _merge(paths, tmp_path / "py.json", True, monkeypatch)
        assert _normal(fast) == _normal(twin), case


@pytest.mark.parametrize(
    "text, says",
    [
        (b'{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "ts"', "cut off"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1}', "cut off"),
        (b'{"traceEvents": [{"ph" "X"}]}', "not a JSON object"),
        (b"<html>not a trace</html>", "not a Chrome trace JSON"),
        (b'{"otherEvents": [1]', "ends before its traceEvents"),
    ],
)
def test_a_broken_rank_is_named_with_what_is_wrong(tmp_path, text, says):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RANK0))
    bad = tmp_path / "bad.json"
    bad.write_bytes(text)
    with pytest.raises(TraceFormatError, match=says) as err:
        merge_traces([good, bad], tmp_path / "m.json")
    assert "bad.json" in str(err.value)
    assert not (tmp_path / "m.json").exists(), "no half-written merge left behind"


def test_strings_with_escapes_at_every_offset_of_a_16_byte_block_rewrite_as_the_twin(tmp_path, monkeypatch):
    """The string scan takes 16 bytes at a time: names of 0-40 characters with an escaped quote,
    backslash or unicode escape at every position, and keys after them, give the twin's events."""
    events = []
    for length in range(41):
        for at in range(length + 1):
            for escape in ('"', "\\", "\u00e9", "\n"):
                name = "x" * at + escape + "y" * (length - at)
                events.append({"ph": "X", "name": name, "pid": 1, "tid": 1, "ts": len(events), "dur": 1,
                               "args": {"External id": len(events) + 1, name: name}})
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 1}, "traceEvents": events}))
    _, fast = _merge([path], tmp_path / "c.json", False, monkeypatch, read_bytes=4096)
    _, twin = _merge([path], tmp_path / "py.json", True, monkeypatch)
    assert _normal(fast) == _normal(twin) and len(fast["traceEvents"]) > len(events)
