"""``polyprof convert``: torch.profiler's and polyprof's JSON to Perfetto (streaming) and back, every
event kept, read with the perfetto package's classes."""

import gzip
import json
import subprocess
import sys
from collections import Counter

import pytest
from test_export_perfetto import Parsed, _rows, overlapping_trace

from polyprof.errors import ConfigError, TraceFormatError
from polyprof.formats import dumps_chrome_trace, load_trace
from polyprof.formats.chrome.keys import top_level_keys
from polyprof.tools.convert import convert

pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2", reason="needs the perfetto package (test extra)")


def _slices(parsed):
    """(name, cat, pid, tid, start, end, args) of every slice and instant, lanes mapped to their row."""
    where = {u: (t.thread.pid, t.thread.tid) for u, t in parsed.tracks.items() if t.HasField("thread")}
    meta = next(i for i in parsed.instants if i["name"] == "trace metadata")
    layout = meta["args"]["polyprof.perfetto"]
    for resource, uuid in layout["lanes"]:
        where[uuid] = where[layout["rows"][resource]["track"]]
    items = parsed.slices + [i for i in parsed.instants if i is not meta]
    return Counter((s["name"], s["cat"][0], *where[s["track"]], s["start"], s.get("end", s["start"]),
                    json.dumps(s["args"], sort_keys=True)) for s in items)


def _json_slices(doc):
    """The same of a Chrome JSON document, times in ns as the converter reads them (relative to base)."""
    out = Counter()
    for e in doc["traceEvents"]:
        if e.get("ph") not in ("X", "i", "I") or e.get("cat") == "Trace" or e.get("s") == "g" or e.get("pid") in ("Spans", "Traces"):
            continue
        start = round(e["ts"] * 1000)
        out[(e["name"], e.get("cat", ""), e["pid"], e["tid"], start, start + round(e.get("dur", 0) * 1000),
             json.dumps(e.get("args", {}), sort_keys=True))] += 1
    return out


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory):
    torch = pytest.importorskip("torch", reason="needs torch to write a torch.profiler trace")
    path = tmp_path_factory.mktemp("torch") / "torch.pt.trace.json"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(3):
            with torch.profiler.record_function("step"):
                model(torch.randn(4, 8)).sum().backward()
    p.export_chrome_trace(str(path))
    return path


def test_a_torch_profiler_trace_keeps_every_event_and_its_links(torch_trace, tmp_path):
    out = tmp_path / "t.pftrace"
    stats = convert(torch_trace, out)
    doc = json.loads(torch_trace.read_text())
    parsed = Parsed(out.read_bytes())
    assert _slices(parsed) == _json_slices(doc) and stats.events == sum(_json_slices(doc).values())
    flows = Counter(e["id"] for e in doc["traceEvents"] if e.get("ph") in ("s", "f"))
    assert flows and len(parsed.flow_starts) == len(flows) and parsed.flow_starts == parsed.flow_ends
    meta = next(i for i in parsed.instants if i["name"] == "trace metadata")
    assert meta["args"]["deviceProperties"] == doc.get("deviceProperties", [])
    assert all(meta["args"][k] == v for k, v in doc.items() if k not in ("traceEvents", "traceName", "displayTimeUnit"))
    assert _rows(load_trace(out)) == _rows(load_trace(torch_trace))


def test_polyprofs_json_and_pftrace_convert_both_ways(tmp_path):
    trace = overlapping_trace()
    src = tmp_path / "t.json.gz"
    src.write_bytes(gzip.compress(dumps_chrome_trace(trace)))
    convert(src, tmp_path / "t.pftrace.gz")
    convert(tmp_path / "t.pftrace.gz", tmp_path / "back.json")
    rows = _rows(load_trace(src))
    assert _rows(load_trace(tmp_path / "t.pftrace.gz")) == rows == _rows(load_trace(tmp_path / "back.json"))
    assert load_trace(tmp_path / "t.pftrace.gz").metadata["distributedInfo"] == {"rank": 0}


def test_top_level_keys_around_the_events_and_the_bare_array_form(tmp_path):
    path = tmp_path / "k.json"
    path.write_text('{"schemaVersion": 1, "distributedInfo": {"rank": 3, "note": "]"}, "traceEvents": [\n'
                    '{"ph": "X", "name": "a]", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 1.5, "dur": 2}\n],\n'
                    '"traceName": "x]y", "extra": [1, 2]}')
    keys = top_level_keys(str(path))
    assert keys == {"schemaVersion": 1, "distributedInfo": {"rank": 3, "note": "]"}, "traceName": "x]y", "extra": [1, 2]}
    bare = tmp_path / "bare.json"
    bare.write_text('[{"ph": "X", "name": "a", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 1, "dur": 2}]')
    convert(bare, tmp_path / "bare.pftrace")
    assert [s["name"] for s in Parsed((tmp_path / "bare.pftrace").read_bytes()).slices] == ["a"]


def test_bad_input_is_one_line_before_any_output(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}, {"ph": ')
    with pytest.raises(TraceFormatError, match="broken.json") as err:
        convert(broken, tmp_path / "o.pftrace")
    assert "\n" not in str(err.value) and not (tmp_path / "o.pftrace").exists()
    with pytest.raises(ConfigError, match="the output is the input"):
        convert(broken, broken)
    r = subprocess.run([sys.executable, "-m", "polyprof", "convert", str(broken), str(tmp_path / "o.pftrace")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "broken.json" in r.stderr and "Traceback" not in r.stderr
