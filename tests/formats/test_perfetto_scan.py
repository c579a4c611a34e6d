"""The C scanner of Perfetto protobuf traces (csrc/read_packets.c, formats/perfetto/scan.py) reads exactly
what the reference reader (formats/perfetto/read.py) reads, or declines and leaves the file to it: polyprof's own
traces, a merged multi-rank trace, another writer's trace built field by field, and seeded mutants."""

from __future__ import annotations

import itertools
import random
import struct
import subprocess
import sys

import orjson
import pytest
from test_export_perfetto import mutated, overlapping_trace

import polyprof
import polyprof._native
from polyprof.errors import TraceFormatError
from polyprof.formats import dumps_chrome_trace, dumps_perfetto_trace
from polyprof.formats.files import parse_trace
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto import read as perfetto
from polyprof.formats.perfetto import scan as perfetto_scan
from polyprof.formats.perfetto.wire import (
    field_bytes,
    field_double,
    field_fixed64,
    field_string,
    field_varint,
)

pytestmark = pytest.mark.skipif(polyprof._native.extension is None, reason="needs polyprof's C extension (built by setup.sh)")


def _reference(data: bytes, path: str = "t.pftrace"):
    return perfetto.read_with(perfetto.PacketReader(path), data)


def _document(trace) -> dict:
    """What a trace is, as far as anyone reads it: the JSON it writes (args parsed), its counters and
    its places."""
    doc = orjson.loads(dumps_chrome_trace(trace))
    doc["counters"] = trace.counters.samples
    doc["places"] = [(d.key, d.type, d.index, d.name, d.pid, d.label, d.sort_index) for d in trace.devices]
    doc["rows"] = [(r.device, r.id, r.name, r.sort_index) for r in trace.resources]
    doc["clock"] = (trace.epoch_offset_ns, trace.base_time_ns, trace.window)
    return doc


def _scans_as_the_reader_reads(data: bytes) -> None:
    got = perfetto_scan.scan_perfetto(data, "t.pftrace")
    assert got is not None, "the scanner declined a trace it should read"
    assert _document(got) == _document(_reference(data))


def test_polyprofs_traces_scan_to_what_the_reader_reads(registry):
    from fake_backends import SimDeviceBackend

    sim = SimDeviceBackend()
    registry.register(sim)
    with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
        for i in range(20):
            with polyprof.record_function("step", {"batch": i, "tags": ["a", i], "ratio": i / 3}):
                sim.launch(f"kernel {i % 3}")
        polyprof.counter("mem", 2.5)
        polyprof.instant("mark")
    for trace in (prof.trace, overlapping_trace()):
        _scans_as_the_reader_reads(dumps_perfetto_trace(trace))


def test_a_merged_multi_rank_pftrace_scans_the_same(tmp_path):
    import sys

    sys.path.insert(0, "benchmarks")
    from export_throughput import synthetic_trace

    from polyprof.formats import write_trace
    from polyprof.tools.merge_ranks import merge_traces

    paths = []
    for r in range(3):
        trace = synthetic_trace(3000, seed=r)
        trace.metadata["distributedInfo"] = {"backend": "gloo", "rank": r, "world_size": 3}
        paths.append(write_trace(trace, str(tmp_path / f"rank{r}.json")))
    merge_traces(paths, tmp_path / "job.pftrace")
    data = (tmp_path / "job.pftrace").read_bytes()
    _scans_as_the_reader_reads(data)
    assert len(perfetto_scan.scan_perfetto(data).devices) >= 3 * 2


# -- another writer's trace, field by field ------------------------------------------------------
def _packet(*fields: bytes) -> bytes:
    return field_bytes(F.TRACE_PACKET, b"".join(fields))


def _event(ts: int, *fields: bytes, seq: int = 7) -> bytes:
    return _packet(field_varint(F.PACKET_TIMESTAMP, ts), field_varint(F.PACKET_SEQUENCE_ID, seq),
                   field_bytes(F.PACKET_TRACK_EVENT, b"".join(fields)))


def _entry(iid: int, name: str) -> bytes:
    return field_varint(F.INTERNED_IID, iid) + field_string(F.INTERNED_NAME, name)


def _ann(key: str | int, value: bytes) -> bytes:
    name = field_varint(F.ANNOTATION_NAME_IID, key) if isinstance(key, int) else field_string(F.ANNOTATION_NAME, key)
    return field_bytes(F.EVENT_DEBUG_ANNOTATIONS, name + value)


def _other_writers_trace(**changes: bytes) -> bytes:
    """A TrackEvent trace as the Perfetto SDK might write it: a process and two threads, interned and
    inline names and categories, every annotation kind, nested slices, one left open, an end with no
    begin, an instant, flows, counters with int and double values, an event type polyprof never
    writes. `changes` replace named parts (to make the scanner decline)."""
    thread = lambda uuid, tid, name: _packet(field_bytes(F.PACKET_TRACK_DESCRIPTOR, field_varint(F.TRACK_UUID, uuid)  # noqa: E731
        + field_varint(F.TRACK_PARENT_UUID, 1) + field_bytes(F.TRACK_THREAD, field_varint(F.THREAD_PID, 42)
        + field_varint(F.THREAD_TID, tid) + field_string(F.THREAD_NAME, name))))
    parts = {
        "process": _packet(field_bytes(F.PACKET_TRACK_DESCRIPTOR, field_varint(F.TRACK_UUID, 1) + field_bytes(
            F.TRACK_PROCESS, field_varint(F.PROCESS_PID, 42) + field_string(F.PROCESS_NAME, "app")))),
        "threads": thread(11, 100, "main") + thread(12, 101, "worker"),
        "interned": _packet(field_varint(F.PACKET_SEQUENCE_ID, 7), field_varint(F.PACKET_SEQUENCE_FLAGS, 3),
                            field_bytes(F.PACKET_INTERNED_DATA, field_bytes(F.INTERNED_NAMES, _entry(1, "outer"))
                                        + field_bytes(F.INTERNED_CATEGORIES, _entry(1, "user_annotation"))
                                        + field_bytes(F.INTERNED_ANNOTATION_NAMES, _entry(1, "External id"))
                                        + field_bytes(F.INTERNED_ANNOTATION_NAMES, _entry(2, "step")))),
        "outer": _event(1000, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_BEGIN), field_varint(F.EVENT_TRACK_UUID, 11),
                        field_varint(F.EVENT_NAME_IID, 1), field_varint(F.EVENT_CATEGORY_IIDS, 1),
                        _ann(1, field_varint(F.ANNOTATION_INT, 77)), _ann(2, field_varint(F.ANNOTATION_UINT, 3)),
                        _ann("flag", field_varint(F.ANNOTATION_BOOL, 1)),
                        _ann("ratio", field_double(F.ANNOTATION_DOUBLE, 0.1)),
                        _ann("text", field_string(F.ANNOTATION_STRING, 'a "q"\n\u00e9')),
                        _ann("shape", field_bytes(F.ANNOTATION_LEGACY_JSON, b'[[2, 3], {"k": null}]')),
                        _ann("nested", field_bytes(11, field_string(10, "inner"))),  # dict_entries: no value
                        _ann("negative", field_varint(F.ANNOTATION_INT, -5 & (2**64 - 1))),
                        field_fixed64(F.EVENT_FLOW_IDS, 9 * 4 + 2)),
        "inner": _event(1100, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_BEGIN), field_varint(F.EVENT_TRACK_UUID, 11),
                        field_string(F.EVENT_NAME, "inner op"), field_string(22, "cpu_op"),
                        _ann("correlation", field_varint(F.ANNOTATION_INT, 5))),
        "inner end": _event(1200, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_END), field_varint(F.EVENT_TRACK_UUID, 11)),
        "stray end": _event(1250, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_END), field_varint(F.EVENT_TRACK_UUID, 12)),
        "tie": _event(1000, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_BEGIN), field_varint(F.EVENT_TRACK_UUID, 12),
                      field_string(F.EVENT_NAME, "tie"), field_varint(F.EVENT_TERMINATING_FLOW_IDS, 9 * 4 + 2)),
        "tie end": _event(1300, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_END), field_varint(F.EVENT_TRACK_UUID, 12)),
        "instant": _event(1150, field_varint(F.EVENT_TYPE, F.TYPE_INSTANT), field_varint(F.EVENT_TRACK_UUID, 12),
                          field_string(F.EVENT_NAME, "mark")),
        "unknown type": _event(1160, field_varint(F.EVENT_TYPE, 9), field_varint(F.EVENT_TRACK_UUID, 12)),
        "counter track": _packet(field_bytes(F.PACKET_TRACK_DESCRIPTOR, field_varint(F.TRACK_UUID, 20)
                                 + field_varint(F.TRACK_PARENT_UUID, 1) + field_string(F.TRACK_NAME, "queue depth")
                                 + field_bytes(F.TRACK_COUNTER, b""))),
        "counters": _event(1010, field_varint(F.EVENT_TYPE, F.TYPE_COUNTER), field_varint(F.EVENT_TRACK_UUID, 20),
                           field_varint(F.EVENT_COUNTER_VALUE, 4))
        + _event(1020, field_varint(F.EVENT_TYPE, F.TYPE_COUNTER), field_varint(F.EVENT_TRACK_UUID, 20),
                 field_double(F.EVENT_DOUBLE_COUNTER_VALUE, 2.5)),
        "open": _event(1400, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_BEGIN), field_varint(F.EVENT_TRACK_UUID, 13),
                       field_string(F.EVENT_NAME, "never ends"), _ann("finished", field_varint(F.ANNOTATION_BOOL, 1))),
        "outer end": _event(1500, field_varint(F.EVENT_TYPE, F.TYPE_SLICE_END), field_varint(F.EVENT_TRACK_UUID, 11)),
    }
    parts.update(changes)
    return b"".join(parts.values())


def test_another_writers_trace_scans_to_what_the_reader_reads():
    data = _other_writers_trace()
    _scans_as_the_reader_reads(data)
    got = perfetto_scan.scan_perfetto(data)
    outer = next(a for a in got.activities if a.name == "outer")
    assert outer.external_id == 77 and outer.args["shape"] == [[2, 3], {"k": None}] and outer.args["nested"] is None
    assert outer.args["negative"] == -5 and outer.flow_id == 9 and outer.flow_start
    assert next(a for a in got.activities if a.name == "never ends").args["finished"] is False


@pytest.mark.parametrize(
    "change",
    [
        {"redefined": _packet(field_varint(F.PACKET_SEQUENCE_ID, 7), field_bytes(F.PACKET_INTERNED_DATA,
                                                                                   field_bytes(F.INTERNED_NAMES, _entry(1, "renamed"))))},
        {"cleared": _packet(field_varint(F.PACKET_SEQUENCE_ID, 7), field_varint(F.PACKET_SEQUENCE_FLAGS, 1))},
        {"twice": _event(1600, field_varint(F.EVENT_TYPE, F.TYPE_INSTANT), field_varint(F.EVENT_TRACK_UUID, 12),
                         _ann("k", field_varint(F.ANNOTATION_INT, 1)), _ann("k", field_varint(F.ANNOTATION_INT, 2)))},
        {"nan": _event(1600, field_varint(F.EVENT_TYPE, F.TYPE_INSTANT), field_varint(F.EVENT_TRACK_UUID, 12),
                       _ann("k", field_double(F.ANNOTATION_DOUBLE, float("nan"))))},
        {"not utf-8": _event(1600, field_varint(F.EVENT_TYPE, F.TYPE_INSTANT), field_varint(F.EVENT_TRACK_UUID, 12),
                             field_bytes(F.EVENT_NAME, b"\xff\xfe"))},
    ],
    ids=lambda c: next(iter(c)),
)
def test_what_the_scanner_would_read_otherwise_is_left_to_the_reader(change):
    data = _other_writers_trace(**change)
    assert perfetto_scan.scan_perfetto(data) is None
    assert _document(parse_trace(data, "t.pftrace")) == _document(_reference(data))


def test_mutated_traces_scan_to_what_the_reader_reads_or_are_declined():
    """Seeded mutants of polyprof's and another writer's trace (truncated, bytes changed or inserted):
    where the reader refuses one, the scanner declines it; where both read it, they read the same."""
    bases = [dumps_perfetto_trace(overlapping_trace()), _other_writers_trace()]
    rng = random.Random(20261201)
    scanned = refused = declined = 0  # declined: the reader reads it, the scanner leaves it to the reader
    for i in range(600):
        data = bytes(mutated(bases[i % 2], rng, cut=0.2, most_changed=4, most_inserted=4))
        got = perfetto_scan.scan_perfetto(data, f"mutant{i}")
        in_pieces = perfetto_scan.scan_perfetto_pieces(_pieces(data, rng), f"mutant{i}")
        assert (in_pieces is None) == (got is None), f"mutant {i}: read whole and in pieces differ"
        if got is not None:
            assert _document(in_pieces) == _document(got), f"mutant {i}: read in pieces differs"
        try:
            expected = _reference(data, f"mutant{i}")
        except TraceFormatError:
            assert got is None, f"mutant {i}: the reader refuses it, the scanner read it"
            refused += 1
            continue
        if got is None:
            declined += 1
            continue
        scanned += 1
        assert _document(got) == _document(expected), f"mutant {i} differs"
    assert scanned > 40 and refused > 300 and declined < scanned, (scanned, refused, declined)


def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    """`data` cut at a few random places (and half the time an empty piece after them)."""
    cuts = sorted({0, len(data), *(rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 8)))})
    pieces = [data[a:b] for a, b in itertools.pairwise(cuts)]
    return pieces + [b""] if rng.random() < 0.5 else pieces


def test_a_trace_read_in_pieces_is_the_trace_read_whole():
    """Every cut of a trace into two pieces, and into pieces of 1 to 5 bytes: the same trace."""
    data = dumps_perfetto_trace(overlapping_trace())
    whole = _document(perfetto_scan.scan_perfetto(data))
    for at in range(0, len(data) + 1, 7):
        assert _document(perfetto_scan.scan_perfetto_pieces([data[:at], data[at:]])) == whole, at
    for size in range(1, 6):
        pieces = [data[i : i + size] for i in range(0, len(data), size)]
        assert _document(perfetto_scan.scan_perfetto_pieces(pieces)) == whole, size


def test_a_trace_cut_off_in_its_last_packet_is_left_to_the_reader(tmp_path):
    data = dumps_perfetto_trace(overlapping_trace())
    assert perfetto_scan.scan_perfetto_pieces([data[:-3]]) is None
    path = tmp_path / "cut.pftrace"
    path.write_bytes(data[:-3])
    with pytest.raises(TraceFormatError, match="cut.pftrace"):
        polyprof.load_trace(path)


def test_load_trace_of_a_pftrace_goes_through_the_scanner(tmp_path, monkeypatch):
    path = tmp_path / "t.pftrace"
    path.write_bytes(dumps_perfetto_trace(overlapping_trace()))
    calls = []
    real = perfetto_scan.scan_perfetto_pieces
    monkeypatch.setattr(perfetto_scan, "scan_perfetto_pieces", lambda *a: calls.append(a[1]) or real(*a))
    from polyprof.formats import load_trace

    assert len(load_trace(str(path)).activities) == len(overlapping_trace().activities)
    assert calls == [str(path)]


def test_record_layout_matches_the_c_struct():
    # a trace with one instant: the record's fields land where PF_DTYPE says
    data = _packet(field_varint(F.PACKET_SEQUENCE_ID, 1)) + _event(
        123, field_varint(F.EVENT_TYPE, F.TYPE_INSTANT), field_varint(F.EVENT_TRACK_UUID, 2**63 + 5), seq=1
    )
    raw = polyprof._native.extension.scan_packets(data)[0]
    assert len(raw) == perfetto_scan.PF_DTYPE.itemsize
    ts, end, track = struct.unpack_from("<qqQ", raw)
    assert (ts, end, track) == (123, 123, 2**63 + 5)


def test_metadata_only_gives_the_place_and_clock_without_the_events():
    """`polyprof merge`'s first pass: a rank's metadata, devices, rows, clock and window as the whole
    read gives them, no activities; a trace that does not record its window is left to the whole read."""
    data = dumps_perfetto_trace(overlapping_trace())
    whole, head = _reference(data), perfetto_scan.scan_perfetto(data, metadata_only=True)
    assert head is not None and len(head.activities) == 0 and len(whole.activities) > 0
    assert head.metadata == whole.metadata and head.window == whole.window
    assert (head.epoch_offset_ns, head.base_time_ns) == (whole.epoch_offset_ns, whole.base_time_ns)
    assert {k: s.to_json() for k, s in head.backends.items()} == {k: s.to_json() for k, s in whole.backends.items()}
    assert _document(head)["places"] == _document(whole)["places"] and _document(head)["rows"] == _document(whole)["rows"]
    assert perfetto_scan.scan_perfetto(_other_writers_trace(), metadata_only=True) is None


PEAK_OF_LOAD = """import sys
import polyprof.formats.perfetto.read, polyprof.formats.perfetto.scan  # what reading imports: not counted
from polyprof.formats import load_trace
status = lambda key: int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith(key)))
before = status('VmRSS:')
trace = load_trace(sys.argv[1])
print(len(trace.activities), (status('VmHWM:') - before) >> 10)
"""


def test_a_large_pftrace_is_read_without_holding_its_bytes(tmp_path):
    """A 96 MiB .pftrace whose bytes are mostly packets' fields nobody reads: load_trace scans it as it
    reads it, so its peak holds a piece of the file (1 MiB) and the packet cut at a piece's end, not
    the file (it held all of it, and a copy, before)."""
    path = tmp_path / "padded.pftrace"
    padding = _packet(field_bytes(900, bytes(64 << 10)))  # a field of TracePacket no reader knows
    with open(path, "wb") as f:
        f.write(dumps_perfetto_trace(overlapping_trace()))
        for _ in range(1536):
            f.write(padding)
    assert path.stat().st_size > 96 << 20
    run = subprocess.run([sys.executable, "-c", PEAK_OF_LOAD, str(path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows, peak_mib = map(int, run.stdout.split())
    assert rows == len(overlapping_trace().activities)
    assert peak_mib < 24, f"reading a 96 MiB file took {peak_mib} MiB more"


def _rows_of(trace, keys=None) -> list[tuple]:
    """Each row as far as anyone reads it (with its key in the file's order, where given)."""
    acts = trace.activities
    names = acts.strings.strings
    return [(int(acts["start"][i]), int(acts["end"][i]), names[int(acts["name"][i])], names[int(acts["cat"][i])],
             int(acts["kind"][i]), trace.resources[int(acts["resource"][i])].name,
             trace.devices[int(acts["device"][i])].key, int(acts["correlation"][i]), int(acts["external_id"][i]),
             int(acts["flow_id"][i]), int(acts["flow_type"][i]), int(acts["flow_start"][i]), acts.args.get(i, {}),
             *(() if keys is None else (int(keys[i]),))) for i in range(len(acts))]


def test_mutated_traces_read_in_chunks_give_the_rows_the_reader_reads_or_are_declined(tmp_path, monkeypatch):
    """Seeded mutants of polyprof's and another writer's trace, read in chunks taken after every few records (the scanner
    keeping slices still open across takes): declined, or the rows, counters and places the whole
    file's reader gives, in its order once sorted by start, longer first (a slice never closed as if it
    ended where it began), then key."""
    from polyprof.formats.perfetto import chunks

    bases = [dumps_perfetto_trace(overlapping_trace()), _other_writers_trace()]
    rng = random.Random(20261207)
    read = 0
    for i in range(400):
        base = bases[i % 2]
        data = base if i < 2 else bytes(mutated(base, rng, cut=0.2, most_changed=4, most_inserted=4))
        path = tmp_path / f"mutant{i}.pftrace"
        path.write_bytes(data)
        monkeypatch.setattr(chunks, "FEED_BYTES", rng.choice([1, 7, 64, 1 << 20]))
        try:
            got = list(chunks.perfetto_chunks(str(path), rng.choice([1, 3, 50])))
        except chunks.Declined:
            continue
        expected = _reference(data, str(path))
        never_closed = lambda r: r[-1] >> 61 == 2  # noqa: E731 - the reader sorts them as ending where they begin
        rows = sorted((r for c in got for r in _rows_of(c.trace, c.rows)),
                      key=lambda r: (r[0], -(r[0] if never_closed(r) else r[1]), r[-1]))
        assert [r[:-1] for r in rows] == _rows_of(expected), f"mutant {i}: its rows differ"
        sample = lambda s: (s.ts, s.name, s.device, s.value, s.resource)  # noqa: E731
        assert (sorted(sample(s) for c in got for s in c.trace.counters.samples)
                == sorted(sample(s) for s in expected.counters.samples)), f"mutant {i}: its counters differ"
        places = lambda t: sorted((repr(t.devices[r.device]), r.id, r.name, r.sort_index) for r in t.resources)  # noqa: E731
        assert places(got[-1].trace) == places(expected), f"mutant {i}: its places differ"  # (tracks without a
        # row in the layout get theirs as they are met: in another order than the whole file's reader meets them)
        read += 1
    assert read > 20, read
