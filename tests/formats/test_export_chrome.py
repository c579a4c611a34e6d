import gzip
import json
import os
import re
import stat

import numpy as np
import pytest
from fake_backends import SimDeviceBackend

import polyprof
from polyprof.errors import OutputPathError
from polyprof.formats import dumps_chrome_trace, load_trace, write_chrome_trace
from polyprof.model import ActivityKind


@pytest.fixture
def trace(registry):
    sim = SimDeviceBackend()
    registry.register(sim)
    with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
        with polyprof.record_function("step", {"batch": 3}):
            sim.launch('kern"el\nwith quotes')
        polyprof.counter("mem", 1.5)
    return prof.trace


def test_top_level_keys_in_kineto_order(trace):
    text = dumps_chrome_trace(trace, "t.json").decode()
    doc = json.loads(text)
    keys = list(doc)
    assert keys[:2] == ["schemaVersion", "deviceProperties"]
    assert keys[-4:] == ["displayTimeUnit", "baseTimeNanoseconds", "traceEvents", "traceName"]
    assert doc["schemaVersion"] == 1 and doc["displayTimeUnit"] == "ms" and doc["traceName"] == "t.json"
    assert isinstance(doc["baseTimeNanoseconds"], int)
    assert doc["deviceProperties"] == [{"id": 0, "name": "Sim GPU", "type": "sim", "memory": 1 << 30}]
    assert "polyprof" in keys and "host_name" in keys


def test_complete_events_have_kinetos_fields_and_microsecond_times(trace):
    doc = json.loads(dumps_chrome_trace(trace))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "Trace"]  # not the envelope
    assert all(list(e)[:7] == ["ph", "cat", "name", "pid", "tid", "ts", "dur"] for e in xs)
    step = next(e for e in xs if e["name"] == "step")
    a = next(a for a in trace.activities if a.name == "step")
    expected_ts = (a.start + trace.epoch_offset_ns - trace.base_time_ns) / 1000
    assert step["ts"] == pytest.approx(expected_ts, abs=0.0005) and step["dur"] == pytest.approx(
        a.duration / 1000, abs=0.0005
    )
    assert step["args"] == {"External id": a.correlation, "batch": 3}
    kernel = next(e for e in xs if e["cat"] == "kernel")
    assert kernel["name"] == 'kern"el\nwith quotes'
    assert kernel["args"]["External id"] == a.correlation and "correlation" in kernel["args"]
    runtime = next(e for e in xs if e["cat"] == "sim_runtime")
    assert runtime["args"]["correlation"] == kernel["args"]["correlation"]


def test_timestamps_have_exactly_three_decimals(trace):
    text = dumps_chrome_trace(trace).decode()
    import re

    stamps = re.findall(r'"(?:ts|dur)":(-?[0-9.]+)', text)
    assert stamps and all(re.fullmatch(r"\d+\.\d{3}", s) for s in stamps)


def test_flows_are_ac2g_pairs_with_bp_e_on_the_end(trace):
    events = json.loads(dumps_chrome_trace(trace))["traceEvents"]
    s = [e for e in events if e["ph"] == "s"]
    f = [e for e in events if e["ph"] == "f"]
    assert len(s) == len(f) == 1
    assert (
        s[0]["id"] == f[0]["id"]
        and s[0]["cat"] == s[0]["name"] == "ac2g"
        and f[0]["bp"] == "e"
        and "bp" not in s[0]
    )
    runtime = next(e for e in events if e.get("cat") == "sim_runtime")
    kernel = next(e for e in events if e.get("cat") == "kernel")
    assert (s[0]["pid"], s[0]["tid"], s[0]["ts"]) == (runtime["pid"], runtime["tid"], runtime["ts"])
    assert (f[0]["pid"], f[0]["tid"], f[0]["ts"]) == (kernel["pid"], kernel["tid"], kernel["ts"])


def test_metadata_rows_counters_and_window_end(trace):
    events = json.loads(dumps_chrome_trace(trace))["traceEvents"]
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0, 0)] == {"name": "Sim GPU"}
    assert meta[("process_labels", os.getpid(), 0)] == {"labels": "CPU"}
    assert meta[("thread_name", 0, 7)] == {"name": "queue 7"}
    assert ("process_sort_index", 0, 0) in meta and ("thread_sort_index", 0, 7) in meta
    (counter,) = [e for e in events if e["ph"] == "C"]
    assert counter["name"] == "mem" and counter["args"] == {"mem": 1.5}
    assert events[-1]["name"] == "Record Window End" and events[-1]["s"] == "g"


def test_gzip_written_directly_and_round_trips(trace, tmp_path):
    path = write_chrome_trace(trace, tmp_path / "t.json.gz")
    with open(path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    assert not any(p.name.endswith(".tmp") or p.name == "t.json" for p in tmp_path.iterdir())
    doc = json.loads(gzip.decompress(open(path, "rb").read()))
    assert doc["traceName"] == str(tmp_path / "t.json.gz")
    back = load_trace(path)
    assert sorted(a.name for a in back.activities) == sorted(a.name for a in trace.activities)


def test_round_trip_keeps_kinds_devices_flows_and_times(trace, tmp_path):
    back = load_trace(write_chrome_trace(trace, tmp_path / "t.json"))
    orig = {(a.name, a.cat): a for a in trace.activities}
    assert len(orig) == len(trace.activities) == len(back.activities)
    for a in back.activities:
        o = orig[(a.name, a.cat)]
        assert a.kind == o.kind and a.cat == o.cat
        assert a.duration == o.duration
        assert a.start == o.start + trace.epoch_offset_ns - trace.base_time_ns
    kernel = back.activities_of(ActivityKind.KERNEL)[0]
    runtime = back.activities_of(ActivityKind.RUNTIME)[0]
    assert kernel.flow_id == runtime.flow_id != 0 and runtime.flow_start and not kernel.flow_start
    assert back.devices[kernel.device].name == "Sim GPU"
    assert back.resources[kernel.resource].name == "queue 7"
    assert back.backends["simdev"].state == "ran"
    assert [s.value for s in back.counters.samples] == [1.5]


def test_failed_export_leaves_no_file(trace, tmp_path, monkeypatch):
    import polyprof.formats.chrome.write as chrome

    def explode(*a, **k):
        yield b"{}"
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(chrome, "iter_event_chunks", explode)
    target = tmp_path / "t.json"
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_chrome_trace(trace, target)
    assert list(tmp_path.iterdir()) == []


def test_failed_export_keeps_an_existing_trace_intact(trace, tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    target.write_text("previous trace")
    import polyprof.formats.chrome.write as chrome

    monkeypatch.setattr(chrome, "device_properties", lambda t: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        write_chrome_trace(trace, target)
    assert target.read_text() == "previous trace"


@pytest.mark.parametrize(
    "make_path,match",
    [
        (lambda d: d / "missing" / "t.json", "does not exist"),
        (lambda d: d, "is a directory"),
    ],
)
def test_unwritable_paths_are_clear_errors(tmp_path, make_path, match, trace):
    with pytest.raises(OutputPathError, match=match):
        write_chrome_trace(trace, make_path(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_read_only_folder(tmp_path, trace):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(OutputPathError, match="not writable"):
        write_chrome_trace(trace, ro / "t.json")


def test_large_trace_with_many_chunks(registry, tmp_path):
    from polyprof.formats.chrome import write as chrome

    n = chrome.CHUNK_ROWS * 2 + 17
    with polyprof.profile(["cpu"], registry=registry) as prof:
        for i in range(n):
            with polyprof.record_function("r", {"i": i} if i % 1000 == 0 else None):
                pass
    doc = json.loads(dumps_chrome_trace(prof.trace))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "Trace"]  # not the envelope
    assert len(xs) == n
    assert sum(1 for e in xs if "i" in e["args"]) == len(range(0, n, 1000))
    ts = np.array([e["ts"] for e in xs])
    assert np.all(np.diff(ts) >= 0)


def test_c_and_python_formatters_write_identical_bytes():
    from polyprof._native import extension as speedups
    from polyprof._native.shared import FLAG_CORRELATION, FLAG_FLOW_START, FLAG_INSTANT
    from polyprof._native.twins.writers import format_activities as format_activities_py

    if speedups is None:
        pytest.skip("the C extension is not built here, so there is nothing to compare")
    rng = np.random.default_rng(3)
    n = 5000
    names = ['"a"', '"b\\"c"', '"unicode \u00e9"', '"kernel<1>"']
    cols = (
        rng.integers(0, 4, n),  # cat
        rng.integers(0, 4, n),  # name
        rng.integers(-2, 70000, n),  # pid (negative: an overhead row)
        rng.integers(0, 2**40, n),  # tid
        rng.integers(0, 10**16, n),  # start
        rng.integers(0, 10**7, n),  # end - start (made the end below; some rows end before they start)
        rng.integers(0, 3, n) * rng.integers(1, 10**9, n),  # external id, often 0
        rng.integers(0, 3, n) * rng.integers(1, 10**12, n),  # correlation
        rng.integers(0, 2, n) * rng.integers(1, 10**6, n),  # flow id
        rng.integers(0, 4, n),  # flow type (3: unknown, written without a flow)
        rng.choice(
            [0, FLAG_CORRELATION, FLAG_INSTANT, FLAG_FLOW_START, FLAG_CORRELATION | FLAG_FLOW_START], n
        ),
    )
    # the columns in the widths the trace stores them in (int32 strings, int8 flow type and flags)
    widths = (np.int32, np.int32, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, np.int8, np.int8)
    cols = [np.ascontiguousarray(c, dtype=w) for c, w in zip(cols, widths, strict=True)]
    cols[5] = cols[4] + cols[5] - (rng.random(n) < 0.01) * 10**8  # end
    cols = tuple(cols)
    offset = -(10**15)  # rows before the base time are written at 0
    extra = [('{"External id":1,"grid":[1,2,3]}' if i % 7 == 0 else None) for i in range(n)]
    c_text = speedups.format_activities(cols, offset, names, extra).decode()
    py_text = format_activities_py(cols, offset, [x.encode() for x in names], [x and x.encode() for x in extra]).decode()
    assert c_text == py_text
    json.loads("[" + c_text + "]")  # and it is valid JSON



def test_c_formatter_rows_of_the_widest_kind_fit_its_one_allocation():
    """The C formatter sizes its output once from a per-row bound: rows whose every number has the most
    digits (and a flow end, args of every shape) come out whole and equal to the Python twin's."""
    from polyprof._native import extension as speedups
    from polyprof._native.shared import FLAG_CORRELATION, FLAG_INSTANT
    from polyprof._native.twins.writers import format_activities as format_activities_py

    if speedups is None:
        pytest.skip("the C extension is not built here, so there is nothing to compare")
    n = 10_000  # past the row count where the formatter lets go of the GIL
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min + 1
    names = ['"' + "n" * 300 + '"', '""']
    full = lambda v: np.full(n, v, dtype=np.int64)  # noqa: E731
    flags = np.where(np.arange(n) % 2 == 0, FLAG_CORRELATION, FLAG_INSTANT | FLAG_CORRELATION).astype(np.int8)
    cols = (
        np.arange(n, dtype=np.int32) % 2, np.zeros(n, dtype=np.int32), full(small), full(small),
        full(big // 2), full(big), full(small), full(small), full(small), np.full(n, 2, dtype=np.int8), flags,
    )
    extra = [None if i % 3 else '{"k":"' + "v" * (i % 997) + '"}' for i in range(n)]
    c_text = speedups.format_activities(cols, -(big // 2), names, extra).decode()
    assert c_text == format_activities_py(cols, -(big // 2), [x.encode() for x in names],
                                          [x and x.encode() for x in extra]).decode()
    assert len(json.loads("[" + c_text + "]")) == 2 * n  # each row and its flow end

def _with_column_args(trace):
    """The trace with args on every other row from a column block, plus one row with dict args too."""
    import dataclasses

    from polyprof.model import ActivityTable, ArgColumns, Args, JSONColumn

    acts = trace.activities
    rows = np.arange(0, len(acts), 2)
    m = len(rows)
    block = ArgColumns(
        ("device", "queued", "grid", "ok", "label", "correlation", "raw"),
        (
            np.arange(m, dtype=np.int32),
            np.linspace(0.0, 2.5, m),
            [(int(i), 1, 1) for i in rows],
            np.array([i % 2 == 0 for i in range(m)]),
            [f'k"{i}' for i in range(m)],
            np.arange(m) + 100,
            JSONColumn([b'{"dims": [[2, 3]]}' if i % 2 == 0 else b"" for i in range(m)]),  # b"": no key
        ),
    )
    args = Args({int(rows[0]): {"extra": [1, 2]}, 1: {"only": "dict"}})
    args.add_block(rows, block)
    with_blocks = dataclasses.replace(trace, activities=ActivityTable(acts.strings, acts.columns, args))
    as_dicts = dataclasses.replace(
        trace, activities=ActivityTable(acts.strings, acts.columns, {r: args[r] for r in args})
    )
    return with_blocks, as_dicts


@pytest.mark.parametrize("c_formatter", [True, False])
def test_column_args_are_written_like_the_same_args_as_dicts(trace, monkeypatch, c_formatter):
    from native_sides import use_python_side

    import polyprof._native

    if not c_formatter:
        use_python_side(monkeypatch)
    elif polyprof._native.extension is None:
        pytest.skip("the C extension is not built here")
    with_blocks, as_dicts = _with_column_args(trace)
    text = dumps_chrome_trace(with_blocks).decode()
    doc = json.loads(text)
    assert doc == json.loads(dumps_chrome_trace(as_dicts))
    # json.loads keeps the last of duplicate keys, so check the text: one correlation per event
    assert all(line.count('"correlation":') <= 1 for line in text.splitlines())
    xs = [e for e in doc["traceEvents"] if e["ph"] in "Xi" and e.get("cat") != "Trace"]
    first = xs[0]["args"]
    assert first["extra"] == [1, 2] and first["device"] == 0 and first["grid"] == [0, 1, 1]
    assert first["ok"] is True and first["label"] == 'k"0' and first["correlation"] == 100
    assert list(first).count("correlation") == 1 and first["raw"] == {"dims": [[2, 3]]}
    assert "raw" not in xs[2]["args"]  # the second block row has no "raw"


def test_column_args_across_chunk_boundaries(trace, monkeypatch):
    from polyprof.formats.chrome import write as chrome

    monkeypatch.setattr(chrome, "CHUNK_ROWS", 2)  # every chunk holds block rows, dict rows or both
    with_blocks, as_dicts = _with_column_args(trace)
    assert len(with_blocks.activities) >= 4  # two chunks at least
    assert json.loads(dumps_chrome_trace(with_blocks)) == json.loads(dumps_chrome_trace(as_dicts))


def test_a_rewritten_trace_keeps_its_mode_and_no_temporary_file_is_left(tmp_path):
    import polyprof

    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function("x"):
            pass
    out = tmp_path / "t.json"
    prof.export_chrome_trace(str(out))
    os.chmod(out, 0o600)
    prof.export_chrome_trace(str(out))
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600, "the user's mode is kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_an_os_error_while_writing_is_one_line_naming_the_path(tmp_path, monkeypatch):
    import errno

    import polyprof
    from polyprof.errors import OutputPathError
    from polyprof.formats.chrome import write as chrome

    with polyprof.profile(["cpu"]) as prof:
        pass

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(chrome, "_write", full)
    out = tmp_path / "t.json"
    with pytest.raises(OutputPathError, match=rf"writing the trace to {re.escape(str(out))} failed: No space left on device"):
        prof.export_chrome_trace(str(out))
    assert list(tmp_path.iterdir()) == [], "the temporary file is removed"
