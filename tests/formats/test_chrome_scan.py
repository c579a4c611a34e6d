"""The C scanner of Chrome-trace JSON (csrc/read_events.c, formats/chrome/scan.py) reads exactly what the
reference reader (formats/chrome/read.py) reads, or declines and leaves the file to it. One leniency: bytes the
scanner does not use (an unknown key's value) are not validated, so a file that is invalid JSON only
there is read, where the reader refuses the whole file; what it reads is still written as valid JSON."""

from __future__ import annotations

import gzip
import random

import orjson
import pytest
from test_reader_fuzz import _mutate, _polyprof_doc, _torch_doc

import polyprof._native
from polyprof.formats import dumps_chrome_trace, load_trace
from polyprof.formats.chrome import read as chrome
from polyprof.formats.chrome import scan as chrome_scan
from polyprof.formats.files import parse_trace

pytestmark = pytest.mark.skipif(polyprof._native.extension is None, reason="needs polyprof's C extension (built by setup.sh)")


def _reference(data: bytes, path: str, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(chrome_scan, "scan_trace", lambda *a: None)
        return parse_trace(data, path)


def _same(a, b) -> bool:
    """The two traces write the same document (JSON-encoded args are written as read, so compare parsed)."""
    return orjson.loads(dumps_chrome_trace(a)) == orjson.loads(dumps_chrome_trace(b))


def test_mutated_traces_scan_to_what_the_reader_reads_or_are_declined(registry, monkeypatch):
    bases = [_polyprof_doc(registry), _torch_doc()]
    rng = random.Random(20261202)
    scanned = declined = lenient = 0
    for i in range(600):
        data = _mutate(bases[i % 2], rng)
        got = chrome_scan.scan_trace(data, f"mutant{i}.json")
        if got is None:
            declined += 1
            continue
        scanned += 1
        parse_trace(dumps_chrome_trace(got), "again.json")  # what the scanner read is written as valid JSON
        try:
            expected = _reference(data, f"mutant{i}.json", monkeypatch)
        except chrome.TraceFormatError as exc:
            assert "is not valid JSON" in str(exc), f"mutant {i}: the reader refuses it for another reason: {exc}"
            lenient += 1
            continue
        assert _same(got, expected), f"mutant {i} differs"
    assert scanned > 200 and declined > 50 and lenient < scanned // 10, (scanned, declined, lenient)


def test_the_untouched_traces_are_scanned_not_declined(registry, monkeypatch):
    for doc in (_polyprof_doc(registry), _torch_doc()):
        data = orjson.dumps(doc)
        got = chrome_scan.scan_trace(data, "t.json")
        assert got is not None
        assert len(got.activities) > 10 and _same(got, _reference(data, "t.json", monkeypatch))


def test_a_file_read_in_tiny_chunks_and_gzip_scans_the_same(registry, tmp_path, monkeypatch):
    data = orjson.dumps(_torch_doc())
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    expected = _reference(data, "t.json", monkeypatch)
    monkeypatch.setattr(chrome_scan, "CHUNK", 97)  # every event straddles a chunk boundary somewhere
    for path in (plain, packed):
        got = chrome_scan.scan_file(str(path), 1 << 30)
        assert got is not None and _same(got, expected)
    assert chrome_scan.scan_file(str(plain), len(data) - 1) is None, "over the limit: left to the reader"


def test_load_trace_uses_the_scanner_and_the_reader_still_names_problems(tmp_path, monkeypatch):
    good = tmp_path / "good.json"
    good.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 1.5, "dur": 2}]}')
    calls = []
    real = chrome_scan.scan_file
    monkeypatch.setattr(chrome_scan, "scan_file", lambda *a: calls.append(a) or real(*a))
    trace = load_trace(good)
    assert calls and trace.activities["start"].tolist() == [1500] and trace.activities["end"].tolist() == [3500]
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": "soon"}]}')
    with pytest.raises(chrome.TraceFormatError, match=r"bad.json: traceEvents\[0\] has a non-numeric timestamp"):
        load_trace(bad)
    cut = tmp_path / "cut.json"
    cut.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(chrome.TraceFormatError, match="cut.json: is truncated"):
        load_trace(cut)


def test_a_scanned_trace_writes_the_same_pftrace_as_the_read_one(registry, tmp_path, monkeypatch):
    from polyprof.formats import write_trace

    data = orjson.dumps(_torch_doc())
    scanned, read = chrome_scan.scan_trace(data, "t.json"), _reference(data, "t.json", monkeypatch)
    assert any(b.columns for b in scanned.activities.args.blocks), "args kept as JSON text"
    a = load_trace(write_trace(scanned, str(tmp_path / "scanned.pftrace")))
    b = load_trace(write_trace(read, str(tmp_path / "read.pftrace")))
    assert _same(a, b)


def test_flows_away_from_their_events_land_on_the_same_rows_as_the_readers(monkeypatch):
    """Flow events shuffled among the slices (not right after their activity, as Kineto writes them):
    each goes to the last row of its thread starting at its time, the scanner as the reader."""
    rng = random.Random(77)
    events = []
    for i in range(200):
        pid, tid, ts = rng.choice([1, 2]), rng.choice([10, 11, "t"]), rng.randrange(50)
        events.append({"ph": "X", "name": f"op{i}", "cat": "cuda_runtime", "pid": pid, "tid": tid, "ts": ts, "dur": 1})
        if rng.random() < 0.5:
            events.append({"ph": rng.choice("sf"), "id": rng.randrange(1, 40), "cat": rng.choice(["ac2g", "fwdbwd"]),
                           "name": "flow", "pid": pid, "tid": rng.choice([tid, 12]), "ts": rng.choice([ts, ts + 1])})
    rng.shuffle(events)
    data = orjson.dumps({"traceEvents": events})
    got = chrome_scan.scan_trace(data, "shuffled.json")
    assert got is not None and int((got.activities["flow_id"] != 0).sum()) > 20
    assert _same(got, _reference(data, "shuffled.json", monkeypatch))


@pytest.mark.parametrize("raw", [b"\x00", b"\x01", b"\n"], ids=["NUL", "SOH", "newline"])
def test_an_args_key_with_a_raw_control_byte_is_declined_and_refused_in_one_line(raw):
    """Found by test_reader_fuzz: a NUL inside an args key split the key block's signature in two (7
    keys for 6 columns) and the trace read could not be written. Such a key is not JSON: the scanner
    declines it, the reader refuses the file; the same key escaped reads and writes again."""
    event = b'{"ph":"X","name":"op","pid":1,"tid":1,"ts":1,"dur":2,"args":{"In' + raw + b'put":[1],"b":2}}'
    data = b'{"traceEvents":[' + event + b"]}"
    assert chrome_scan.scan_trace(data, "t.json") is None
    with pytest.raises(chrome.TraceFormatError) as exc:
        parse_trace(data, "t.json")
    assert str(exc.value).startswith("t.json: ") and "\n" not in str(exc.value)
    escaped = data.replace(raw, b"\\u%04x" % raw[0])
    trace = parse_trace(escaped, "t.json")
    args = orjson.loads(dumps_chrome_trace(trace))["traceEvents"]
    assert any(e.get("args", {}).get("In" + raw.decode() + "put") == [1] for e in args)


def test_odd_pids_and_tids_get_one_placement_in_both_readers_and_convert(tmp_path, monkeypatch):
    """A bool, a string, a float and a pid past 32 bits each get a process of their own, the same in the
    reference reader, the scanner and the streaming converter (formats/chrome/dialect.Places)."""
    from polyprof.tools.convert import convert

    odd = [(True, 1), ("gpu", 2), (1.5, 3), (2**40, 9), (7, "t"), (7, 8)]
    events = [{"ph": "X", "name": f"e{i}", "cat": "cpu_op", "pid": pid, "tid": tid, "ts": 10 + i, "dur": 1}
              for i, (pid, tid) in enumerate(odd)]
    data = orjson.dumps({"traceEvents": events})
    reference = _reference(data, "odd.json", monkeypatch)
    pids = [d.pid for d in reference.devices]
    assert all(p < 0 for p in pids[:4]), "none of the odd pids taken as its own"
    assert len(set(pids)) == len(pids) == 5 and 7 in pids
    scannable = orjson.dumps({"traceEvents": [ev for ev in events if type(ev["pid"]) in (int, str)]})
    scanned = chrome_scan.scan_trace(scannable, "odd.json")  # (a bool or float pid: the scanner declines)
    assert scanned is not None and _same(scanned, _reference(scannable, "odd.json", monkeypatch))
    src = tmp_path / "odd.json"
    src.write_bytes(data)
    convert(src, tmp_path / "odd.pftrace")
    converted = load_trace(str(tmp_path / "odd.pftrace"))
    by_name = {a.name: a for a in converted.activities_of(reference.activities_of(0)[0].kind)}
    assert {d.name for d in converted.devices} >= {d.name for d in reference.devices}
    assert len(by_name) == len(odd)
