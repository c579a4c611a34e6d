"""The Perfetto writer, read with the protobuf classes of the ``perfetto`` package (a reader nobody here
wrote): track tree, strict nesting on every track, flows with both ends, interning, and the same
activities, times and args as the JSON of the same trace."""

import gzip
import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from fake_backends import SimDeviceBackend

import polyprof
from polyprof._native import extension as speedups
from polyprof._native.twins.writers import slice_events as slice_events_py
from polyprof.formats import dumps_chrome_trace, dumps_perfetto_trace, format_of
from polyprof.formats.perfetto import fields
from polyprof.formats.perfetto import write as writer
from polyprof.formats.perfetto.order import start_order
from polyprof.merge import merge
from polyprof.model import FLOW_AC2G, ActivityKind, BackendStatus
from polyprof.plugin.clock import base_time_ns
from polyprof.plugin.sink import Sink

pb = pytest.importorskip(
    "perfetto.protos.perfetto.trace.perfetto_trace_pb2", reason="needs the perfetto package (the test extra)"
)
T0 = 1_000_000_000


def overlapping_trace():
    """Host spans that nest and one that overlaps (an asyncio task), a zero-length span, an instant, a
    counter, launches with flows to kernels that overlap on their stream, and args of every type."""
    sink = Sink("t")
    host, thread = sink.host_device(), None
    thread = sink.host_thread(4242, "main")
    gpu = sink.device("gpu:0", type="gpu", index=0, name="GPU 0", properties={"memory": 1 << 30})
    stream = sink.resource(gpu, 7, "stream 7")
    span = lambda name, s, e, **kw: sink.activity(ActivityKind.USER_ANNOTATION, name, device=host,  # noqa: E731
                                                  resource=thread, start=T0 + s, end=T0 + e, **kw)
    span("A", 0, 100, correlation=1, external_id=1, args={"int": 3, "float": 0.25, "str": "x\ny", "bool": True,
                                                       "list": [1, "a"], "none": None, "nested": {"k": [2]}})
    span("B", 10, 50, correlation=2, external_id=2)
    span("C", 50, 50)
    span("task D", 60, 150, args={"big": 2**70})
    span("E", 100, 100)
    sink.activity(ActivityKind.INSTANT, "mark", device=host, resource=thread, start=T0 + 55, end=T0 + 55)
    for i, (ls, ks, ke) in enumerate([(20, 30, 80), (26, 40, 120), (90, 125, 130)], start=10):
        sink.activity(ActivityKind.RUNTIME, "launch", device=host, resource=thread, start=T0 + ls, end=T0 + ls + 3,
                      cat="cuda_runtime", correlation=i, external_id=1, flow_id=i, flow_type=FLOW_AC2G, flow_start=True)
        sink.activity(ActivityKind.KERNEL, f"kernel {i}", device=gpu, resource=stream, start=T0 + ks, end=T0 + ke,
                      correlation=i, external_id=1, flow_id=i, flow_type=FLOW_AC2G, args={"grid": [1, 2, 3]})
    sink.counter("memory", 12.5, ts=T0 + 5)
    sink.counter("memory", 13.5, ts=T0 + 70)
    return merge([sink.seal(BackendStatus("t"))], window=(T0, T0 + 200), epoch_offset_ns=10**18,
                 base_time_ns=base_time_ns(T0 + 10**18), metadata={"distributedInfo": {"rank": 0}})


class Parsed:
    """A .pftrace parsed with perfetto's classes: tracks, interned strings (per packet sequence), and
    slices rebuilt per track by pairing ends with begins the way Perfetto does (after sorting the
    events by time when several sequences were appended, as Trace Processor sorts them)."""

    def __init__(self, data: bytes, sequences: int | None = 1) -> None:
        trace = pb.Trace()
        trace.ParseFromString(data)
        self.packets = list(trace.packet)
        self.tracks = {}
        interned = defaultdict(lambda: ({}, {}, {}))
        self.slices, self.instants, self.counters, self.unclosed = [], [], [], []
        self.flow_starts, self.flow_ends = Counter(), Counter()
        self.snapshot = None
        events = []
        last_ts = {}
        seqs = set()
        for p in self.packets:
            seq = p.trusted_packet_sequence_id
            seqs.add(seq)
            if p.sequence_flags & 1:
                interned[seq] = ({}, {}, {})
            names, cats, keys = interned[seq]
            if p.HasField("clock_snapshot"):
                self.snapshot = p.clock_snapshot
            for e in p.interned_data.event_names:
                names[e.iid] = e.name
            for e in p.interned_data.event_categories:
                cats[e.iid] = e.name
            for e in p.interned_data.debug_annotation_names:
                keys[e.iid] = e.name
            if p.HasField("track_descriptor"):
                self.tracks[p.track_descriptor.uuid] = p.track_descriptor
            if not p.HasField("track_event"):
                continue
            ev = p.track_event
            assert ev.track_uuid in self.tracks, "every event's track is described before it"
            if ev.type not in (ev.TYPE_COUNTER,) and self.tracks[ev.track_uuid].name != writer.METADATA_TRACK:
                assert p.timestamp >= last_ts.get(seq, 0), "a sequence's events come in time order"
                last_ts[seq] = p.timestamp
            events.append((p.timestamp, len(events), ev, names, cats, keys))
        if sequences is not None:
            assert len(seqs) == sequences
        if len(seqs) > 1:
            events.sort(key=lambda e: (e[0], e[1]))
        open_by_track = defaultdict(list)
        for ts, _, ev, names, cats, keys in events:
            if ev.type == ev.TYPE_SLICE_END:
                begin = open_by_track[ev.track_uuid].pop()
                self.slices.append({**begin, "end": ts})
                continue
            if ev.type == ev.TYPE_COUNTER:
                self.counters.append((self.tracks[ev.track_uuid].name, ts, ev.double_counter_value))
                continue
            item = {
                "track": ev.track_uuid,
                "name": names[ev.name_iid] if ev.name_iid else ev.name,
                "cat": [cats[i] for i in ev.category_iids],
                "start": ts,
                "args": {keys[a.name_iid] if a.name_iid else a.name: annotation_value(a) for a in ev.debug_annotations},
                "flows": list(ev.flow_ids),
                "terminating": list(ev.terminating_flow_ids),
                "depth": len(open_by_track[ev.track_uuid]),
            }
            self.flow_starts.update(ev.flow_ids)
            self.flow_ends.update(ev.terminating_flow_ids)
            if ev.type == ev.TYPE_SLICE_BEGIN:
                stack = open_by_track[ev.track_uuid]
                item["parent"] = stack[-1] if stack else None
                stack.append(item)
            else:
                self.instants.append(item)
        self.unclosed = [s for stack in open_by_track.values() for s in stack]

    def metadata_uuid(self):
        return next((u for u, t in self.tracks.items() if t.name == writer.METADATA_TRACK), None)


def annotation_value(a):
    kind = a.WhichOneof("value")
    if kind == "legacy_json_value":
        return json.loads(a.legacy_json_value)
    return getattr(a, kind)


def test_field_numbers_are_perfettos():
    checks = {
        pb.TracePacket: {"timestamp": fields.PACKET_TIMESTAMP, "clock_snapshot": fields.PACKET_CLOCK_SNAPSHOT,
                         "trusted_packet_sequence_id": fields.PACKET_SEQUENCE_ID, "track_event": fields.PACKET_TRACK_EVENT,
                         "interned_data": fields.PACKET_INTERNED_DATA, "sequence_flags": fields.PACKET_SEQUENCE_FLAGS,
                         "timestamp_clock_id": fields.PACKET_TIMESTAMP_CLOCK_ID, "trace_packet_defaults": fields.PACKET_DEFAULTS,
                         "track_descriptor": fields.PACKET_TRACK_DESCRIPTOR, "first_packet_on_sequence": fields.PACKET_FIRST_ON_SEQUENCE},
        pb.TrackEvent: {"type": fields.EVENT_TYPE, "track_uuid": fields.EVENT_TRACK_UUID, "name_iid": fields.EVENT_NAME_IID,
                        "name": fields.EVENT_NAME, "category_iids": fields.EVENT_CATEGORY_IIDS,
                        "debug_annotations": fields.EVENT_DEBUG_ANNOTATIONS, "flow_ids": fields.EVENT_FLOW_IDS,
                        "terminating_flow_ids": fields.EVENT_TERMINATING_FLOW_IDS,
                        "double_counter_value": fields.EVENT_DOUBLE_COUNTER_VALUE, "counter_value": fields.EVENT_COUNTER_VALUE},
        pb.TrackDescriptor: {"uuid": fields.TRACK_UUID, "name": fields.TRACK_NAME, "process": fields.TRACK_PROCESS,
                             "thread": fields.TRACK_THREAD, "parent_uuid": fields.TRACK_PARENT_UUID, "counter": fields.TRACK_COUNTER,
                             "child_ordering": fields.TRACK_CHILD_ORDERING, "sibling_order_rank": fields.TRACK_SIBLING_ORDER_RANK,
                             "description": fields.TRACK_DESCRIPTION},
        pb.ProcessDescriptor: {"pid": fields.PROCESS_PID, "process_name": fields.PROCESS_NAME,
                               "legacy_sort_index": fields.PROCESS_LEGACY_SORT_INDEX, "process_labels": fields.PROCESS_LABELS},
        pb.ThreadDescriptor: {"pid": fields.THREAD_PID, "tid": fields.THREAD_TID, "thread_name": fields.THREAD_NAME,
                              "legacy_sort_index": fields.THREAD_LEGACY_SORT_INDEX},
        pb.DebugAnnotation: {"name_iid": fields.ANNOTATION_NAME_IID, "bool_value": fields.ANNOTATION_BOOL,
                             "int_value": fields.ANNOTATION_INT, "double_value": fields.ANNOTATION_DOUBLE,
                             "string_value": fields.ANNOTATION_STRING, "legacy_json_value": fields.ANNOTATION_LEGACY_JSON,
                             "uint_value": fields.ANNOTATION_UINT, "name": fields.ANNOTATION_NAME},
        pb.InternedData: {"event_categories": fields.INTERNED_CATEGORIES, "event_names": fields.INTERNED_NAMES,
                          "debug_annotation_names": fields.INTERNED_ANNOTATION_NAMES},
        pb.ClockSnapshot: {"clocks": fields.SNAPSHOT_CLOCKS, "primary_trace_clock": fields.SNAPSHOT_PRIMARY_CLOCK},
        pb.ClockSnapshot.Clock: {"clock_id": fields.CLOCK_ID, "timestamp": fields.CLOCK_TIMESTAMP},
        pb.TracePacketDefaults: {"timestamp_clock_id": fields.DEFAULTS_TIMESTAMP_CLOCK_ID},
    }
    for message, expected in checks.items():
        by_name = {f.name: f.number for f in message.DESCRIPTOR.fields}
        assert {k: by_name[k] for k in expected} == expected, message.DESCRIPTOR.name
    assert pb.TrackEvent.TYPE_SLICE_BEGIN == fields.TYPE_SLICE_BEGIN and pb.TrackEvent.TYPE_COUNTER == fields.TYPE_COUNTER


def test_track_tree_nesting_flows_and_interning():
    trace = overlapping_trace()
    parsed = Parsed(dumps_perfetto_trace(trace))
    tracks = parsed.tracks
    processes = {t.process.pid: u for u, t in tracks.items() if t.HasField("process")}
    host = trace.devices[0]
    assert tracks[processes[host.pid]].process.process_name == host.name
    assert tracks[processes[0]].process.process_name == "GPU 0"
    threads = {(t.thread.pid, t.thread.tid): u for u, t in tracks.items() if t.HasField("thread")}
    assert tracks[threads[(host.pid, 4242)]].thread.thread_name == trace.resources[0].name
    assert tracks[threads[(0, 7)]].parent_uuid == processes[0] and tracks[threads[(0, 7)]].thread.thread_name == "stream 7"
    lanes = [t for t in tracks.values() if not t.HasField("thread") and not t.HasField("process") and not t.HasField("counter")
             and t.name != writer.METADATA_TRACK]
    assert sorted(t.name for t in lanes) == sorted([trace.resources[0].name, "stream 7"]), "one lane each for the overlaps"
    assert not parsed.unclosed
    for s in parsed.slices:  # strict nesting: every slice inside its parent on its track
        p = s["parent"]
        if p is not None:
            closed = next(x for x in parsed.slices if x["track"] == p["track"] and x["start"] == p["start"] and x["name"] == p["name"])
            assert closed["start"] <= s["start"] and s["end"] <= closed["end"], (s["name"], p["name"])
    by_name = {s["name"]: s for s in parsed.slices}
    assert by_name["task D"]["track"] != by_name["A"]["track"], "the overlapping task went to a lane"
    assert by_name["B"]["parent"]["name"] == "A"
    assert by_name["kernel 11"]["track"] != by_name["kernel 10"]["track"]
    assert parsed.flow_starts and parsed.flow_starts == parsed.flow_ends, "every flow has both ends"
    assert [(i["name"], i["start"]) for i in parsed.instants if i["name"] == "mark"] == [("mark", T0 + 55)]
    assert parsed.counters == [("memory", T0 + 5, 12.5), ("memory", T0 + 70, 13.5)]
    assert parsed.snapshot.primary_trace_clock == fields.CLOCK_MONOTONIC
    clocks = {c.clock_id: c.timestamp for c in parsed.snapshot.clocks}
    assert clocks[fields.CLOCK_REALTIME] - clocks[fields.CLOCK_MONOTONIC] == trace.epoch_offset_ns


def _json_events(trace):
    doc = json.loads(dumps_chrome_trace(trace))
    base = doc["baseTimeNanoseconds"]
    out = Counter()
    for e in doc["traceEvents"]:
        if e["ph"] not in ("X", "i") or e.get("cat") == "Trace" or e.get("s") == "g":
            continue
        start = round(e["ts"] * 1000) + base - trace.epoch_offset_ns
        end = start + round(e.get("dur", 0) * 1000)
        out[(e["name"], e["cat"], e["pid"], e["tid"], start, end, json.dumps(e.get("args", {}), sort_keys=True))] += 1
    return out, doc


def _pftrace_events(parsed):
    where = {}
    for u, t in parsed.tracks.items():
        if t.HasField("thread"):
            where[u] = (t.thread.pid, t.thread.tid)
    meta = next(i for i in parsed.instants if i["name"] == writer.METADATA_EVENT)
    for resource, uuid in meta["args"][writer.LAYOUT_KEY]["lanes"]:
        row = meta["args"][writer.LAYOUT_KEY]["rows"][resource]
        where[uuid] = where[row["track"]]
    out = Counter()
    for s in parsed.slices + [i for i in parsed.instants if i["name"] != writer.METADATA_EVENT]:
        pid, tid = where[s["track"]]
        out[(s["name"], s["cat"][0], pid, tid, s["start"], s.get("end", s["start"]), json.dumps(s["args"], sort_keys=True))] += 1
    return out, meta


@pytest.mark.parametrize("source", ["sink", "profile"])
def test_the_same_activities_times_and_args_as_the_json(source, registry):
    if source == "sink":
        trace = overlapping_trace()
    else:
        sim = SimDeviceBackend()
        registry.register(sim)
        with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
            for i in range(20):
                with polyprof.record_function("step", {"batch": i}):
                    sim.launch(f"kernel {i % 3}")
                    polyprof.instant("tick", {"i": i})
            polyprof.counter("mem", 1.5)
        trace = prof.trace
    ours, meta = _pftrace_events(Parsed(dumps_perfetto_trace(trace)))
    theirs, doc = _json_events(trace)
    assert ours == theirs and sum(ours.values()) == len(trace.activities)
    for key in ("deviceProperties", "distributedInfo", "polyprof", "baseTimeNanoseconds"):
        if key in doc:
            assert meta["args"][key] == doc[key], key


def test_rows_with_equal_args_share_one_encoding_and_their_own_correlation_wins():
    sink = Sink("t")
    gpu = sink.device("gpu:0", type="gpu", index=0, name="GPU 0")
    stream = sink.resource(gpu, 7, "stream 7")
    rows = [({"grid": [1, 1, 1], "stream": 7}, 1), ({"grid": [1, 1, 1], "stream": 7}, 2), ({"grid": [2, 1, 1]}, 3),
            ({"correlation": 99, "grid": [1, 1, 1]}, 4), ({}, 5), ({"grid": [1, 1, 1], "stream": 7}, 6)]
    for i, (args, corr) in enumerate(rows):
        sink.activity(ActivityKind.KERNEL, f"k{i}", device=gpu, resource=stream, start=T0 + 10 * i, end=T0 + 10 * i + 5,
                      correlation=corr, args=args)
    trace = merge([sink.seal(BackendStatus("t"))], window=(T0, T0 + 100), epoch_offset_ns=0, base_time_ns=0, metadata={})
    encoder = writer._RowEncoder(trace.activities, writer.Interned(), np.zeros(len(rows), np.int64),
                                 trace.activities.columns["correlation"] != 0, np.zeros(len(rows), np.int64))
    by_name = dict(zip((trace.activities.strings.strings[c] for c in trace.activities.columns["name"]), range(len(rows)),
                       strict=True))
    blob = lambda name: encoder.blobs[by_name[name]]  # noqa: E731
    assert blob("k0") is blob("k1") is blob("k5") and blob("k2") != blob("k0"), "equal args: one encoding"
    assert blob("k4") is None, "no args, no annotations"
    writes_corr = encoder.cols[7].tolist()
    assert writes_corr[by_name["k3"]] == 0 and writes_corr[by_name["k0"]] == 1, "a row's own correlation arg wins"
    ours, _ = _pftrace_events(Parsed(dumps_perfetto_trace(trace)))
    theirs, _ = _json_events(trace)
    assert ours == theirs
    k3 = next(s for s in Parsed(dumps_perfetto_trace(trace)).slices if s["name"] == "k3")
    assert k3["args"] == {"correlation": 99, "grid": [1, 1, 1]}


@pytest.mark.parametrize("lanes_max", [3, 50_000])  # a small table, and one so sparse it sorts instead
def test_lanes_used_are_the_distinct_pairs_in_order(lanes_max):
    rng = np.random.default_rng(7)
    resource = rng.integers(0, 40, 5000).astype(np.int64)
    lane = rng.integers(1, lanes_max + 1, 5000).astype(np.int32)
    pairs, which = writer._lanes_used(resource, lane)
    expected = sorted(set(zip(resource.tolist(), lane.tolist(), strict=True)))
    assert pairs == expected
    assert [pairs[w] for w in which.tolist()] == list(zip(resource.tolist(), lane.tolist(), strict=True))
    assert writer._lanes_used(resource[:0], lane[:0])[0] == []


def test_c_and_python_writers_give_the_same_bytes(monkeypatch):
    if speedups is None:
        pytest.skip("polyprof's C extension is not built here")
    trace = overlapping_trace()
    fast = dumps_perfetto_trace(trace)
    from native_sides import use_python_side

    use_python_side(monkeypatch)
    assert dumps_perfetto_trace(trace) == fast


def test_slice_order_nests_every_lane_on_random_spans():
    """Random spans on a few tracks, many overlapping, ties and zero lengths (fixed seed): per lane the
    events pair up as a stack, children inside parents, and events come in time order; C and Python
    agree."""
    rng = np.random.default_rng(1234)
    n = 3000
    track = rng.integers(0, 4, n)
    start = rng.integers(0, 2000, n)
    end = start + np.where(rng.random(n) < 0.1, 0, rng.integers(0, 300, n))
    instant = (rng.random(n) < 0.05).astype(np.int8)
    order = start_order(start)
    events, lane = (np.frombuffer(b, t) for b, t in zip(slice_events_py(track, start, end, instant, order), (np.int64, np.int32),
                                                          strict=True))
    if speedups is not None:
        c_events, c_lane = speedups.slice_events(track, start, end, instant, order)
        assert np.array_equal(np.frombuffer(c_events, np.int64), events) and np.array_equal(np.frombuffer(c_lane, np.int32), lane)
    assert len(events) == 2 * n - int(instant.sum())
    stacks = defaultdict(list)
    last = -1
    for code in events.tolist():
        row, phase = code >> 2, code & 3
        t = end[row] if phase == 1 else start[row]
        assert t >= last
        last = t
        key = (track[row], lane[row])
        if phase == 0:
            if stacks[key]:
                parent = stacks[key][-1]
                assert start[parent] <= start[row] and end[row] <= end[parent]
            stacks[key].append(row)
        elif phase == 1:
            assert stacks[key].pop() == row
    assert not any(stacks.values()) and lane.max() > 0


def test_paths_choose_the_format_and_gzip_works(tmp_path, registry):
    assert format_of("a.pftrace") == format_of("a.perfetto-trace.gz") == "perfetto"
    assert format_of("a.json") == format_of("a.pt.trace.json.gz") == "json"
    with polyprof.profile(["cpu"], registry=registry) as prof:
        with polyprof.record_function("x"):
            pass
    for name in ("t.pftrace", "t.pftrace.gz", "t.perfetto-trace"):
        written = prof.export_chrome_trace(str(tmp_path / name))
        data = (tmp_path / name).read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        assert written.endswith(name) and "x" in {s["name"] for s in Parsed(data).slices}
    prof.export_perfetto(str(tmp_path / "any.bin"))
    assert "x" in {s["name"] for s in Parsed((tmp_path / "any.bin").read_bytes()).slices}
    with pytest.raises(polyprof.ConfigError, match="unknown trace format"):
        format_of("x", "xml")
    from polyprof.profiler.handlers import tensorboard_trace_handler

    handler = tensorboard_trace_handler(str(tmp_path / "tb"), "w", format="perfetto")
    assert handler(prof).endswith(".pt.trace.pftrace")


def _rows(trace):
    """The activities as a multiset of plain rows: place as (pid, tid), times as epoch ns."""
    pid = [d.pid for d in trace.devices]
    tid = [r.id for r in trace.resources]
    off = trace.epoch_offset_ns
    return Counter(
        (int(a.kind), a.name, a.cat, pid[a.device], tid[a.resource], a.start + off, a.end + off, a.correlation,
         a.external_id, a.flow_id, a.flow_type, a.flow_start, json.dumps(a.args, sort_keys=True))
        for a in trace.activities
    )


def test_a_pftrace_reads_back_as_its_json_does_and_keeps_the_layout(tmp_path, registry):
    from polyprof.formats import load_trace

    sim = SimDeviceBackend()
    registry.register(sim)
    with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
        for i in range(10):
            with polyprof.record_function("step", {"batch": i, "tags": ["a", i]}):
                sim.launch(f"kernel {i % 3}")
        polyprof.counter("mem", 2.5)
    for trace in (prof.trace, overlapping_trace()):
        writer.write_perfetto_trace(trace, tmp_path / "t.pftrace.gz")
        (tmp_path / "t.json").write_bytes(dumps_chrome_trace(trace))
        back, from_json = load_trace(tmp_path / "t.pftrace.gz"), load_trace(tmp_path / "t.json")
        assert _rows(back) == _rows(from_json) and len(back.activities) == len(trace.activities)
        assert [(d.key, d.type, d.index, d.name, d.pid, d.label, d.sort_index) for d in back.devices] == [
            (d.key, d.type, d.index, d.name, d.pid, d.label, d.sort_index) for d in trace.devices
        ]
        assert [(r.device, r.id, r.name, r.sort_index) for r in back.resources] == [
            (r.device, r.id, r.name, r.sort_index) for r in trace.resources
        ]
        assert back.counters.samples == trace.counters.samples
        assert {k: st.to_json() for k, st in back.backends.items()} == {k: st.to_json() for k, st in trace.backends.items()}
        assert back.epoch_offset_ns == trace.epoch_offset_ns and back.window == trace.window
        assert back.base_time_ns == trace.base_time_ns and back.metadata == from_json.metadata
        again = Parsed(dumps_perfetto_trace(back))  # and it writes the same slices again
        assert Counter(s["name"] for s in again.slices) == Counter(s["name"] for s in Parsed(dumps_perfetto_trace(trace)).slices)


def test_summary_reads_a_pftrace(tmp_path, registry):
    import subprocess
    import sys

    with polyprof.profile(["cpu"], registry=registry) as prof:
        with polyprof.record_function("the only step"):
            pass
    prof.export_perfetto(str(tmp_path / "t.pftrace"))
    r = subprocess.run([sys.executable, "-m", "polyprof", "summary", str(tmp_path / "t.pftrace")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "the only step" in r.stdout, r.stderr


def mutated(data: bytes, rng, *, cut: float = 0.3, most_changed: int = 8, most_inserted: int = 6) -> bytearray:
    """`data` cut short (a `cut` share of the time), with bytes changed (up to `most_changed`) or bytes
    inserted (up to `most_inserted`), chosen by `rng`."""
    b = bytearray(data)
    how = rng.random()
    if how < cut:
        return b[: rng.randrange(1, len(b))]
    if how < 0.8:
        for _ in range(rng.randrange(1, most_changed)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    else:
        pos = rng.randrange(len(b))
        b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, most_inserted)))
    return b


def test_mutated_pftraces_give_a_trace_or_a_one_line_error():
    """1,000 mutants of a .pftrace (truncated, bytes flipped or inserted), fixed seed: each reads or
    raises TraceFormatError with one line naming the file."""
    import random

    from polyprof.errors import TraceFormatError
    from polyprof.formats.files import parse_trace

    data = dumps_perfetto_trace(overlapping_trace())
    rng = random.Random(15)
    errors = 0
    for i in range(1000):
        b = mutated(data, rng)
        b[0] = 0x0A  # still looks like a Perfetto trace
        try:
            parse_trace(bytes(b), f"mutant{i}.pftrace")
        except TraceFormatError as exc:
            errors += 1
            assert f"mutant{i}.pftrace" in str(exc) and "\n" not in str(exc)
    assert errors > 100
