"""`polyprof merge` of polyprof's .pftrace ranks packet by packet (csrc/merge_packets.c) against the
model's way (each rank read into the model and written again): the same merged trace read back, gzip
in and out, at every chunk boundary; another writer's trace, a field the rewriter does not know and
seeded mutants left to the model's way or refused in one line."""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_export_perfetto import Parsed, mutated, overlapping_trace

import polyprof._native
from polyprof.errors import TraceFormatError
from polyprof.formats import load_trace, write_trace
from polyprof.formats.common import streaming
from polyprof.formats.perfetto import fields as F
from polyprof.formats.perfetto.wire import field_bytes, field_varint
from polyprof.tools import merge_ranks as ranks
from polyprof.tools.merge_ranks import ID_STRIDE, PID_STRIDE, merge_traces

pytestmark = pytest.mark.skipif(polyprof._native.extension is None, reason="needs polyprof's C extension (built by setup.sh)")


def _rank_trace(r: int):
    """overlapping_trace (nesting, lanes, an instant, a counter, flows, args of every type, a
    "correlation" arg) as rank `r`, its clock 1.5 us * r off rank 0's."""
    trace = overlapping_trace()
    trace.metadata["distributedInfo"] = {"backend": "gloo", "rank": r, "world_size": 3}
    trace.metadata["host_name"] = f"node{r % 2}"
    status = next(iter(trace.backends.values()))
    status.clock["to rank 0"] = {"offset_ns": -1500 * r, "uncertainty_ns": 40}
    for st in trace.backends.values():  # the same bytes every run: the seeded mutants too
        st.timings_ms.clear()
    trace.timings_ms.clear()
    trace.devices = [dataclasses.replace(d, pid=4000 + i) for i, d in enumerate(trace.devices)]  # not this process's pid
    return trace


@pytest.fixture
def rank_files(tmp_path):
    paths = [write_trace(_rank_trace(r), str(tmp_path / f"rank{r}.pftrace")) for r in (2, 0)]
    paths.append(write_trace(_rank_trace(1), str(tmp_path / "rank1.pftrace.gz")))
    return paths


def _merge(paths, out, monkeypatch, *, model=False, read_bytes=None):
    """merge_traces, with the rewriter (the ranks it rewrote counted) or, with `model`, the model's way."""
    rewritten = []
    with monkeypatch.context() as m:
        describe, rewrite = ranks._describe, ranks._rewrite_rank_packets
        if model:
            m.setattr(ranks, "_describe", lambda path, position: (*describe(path, position)[:2], False))
        m.setattr(ranks, "_rewrite_rank_packets", lambda path, *a: rewritten.append(path) or rewrite(path, *a))
        if read_bytes:
            m.setattr(streaming, "READ_BYTES", read_bytes)
        stats = merge_traces(paths, out)
    return stats, rewritten


def _read_back(path):
    """The merged trace as anyone reads it: every row with its place, ids and args (sorted), the
    processes, counters, metadata and clock. Lanes are rows of their own when read back, under their
    row's name."""
    trace = load_trace(path)
    acts, strings = trace.activities, trace.activities.strings.strings
    rows = []
    for i in range(len(acts)):
        res = trace.resources[int(acts["resource"][i])]
        dev = trace.devices[res.device]
        rows.append((int(acts["start"][i]), int(acts["end"][i]), strings[int(acts["name"][i])], strings[int(acts["cat"][i])],
                     int(acts["kind"][i]), dev.name, dev.pid, res.name, int(acts["correlation"][i]),
                     int(acts["external_id"][i]), int(acts["flow_id"][i]), int(acts["flow_type"][i]),
                     int(acts["flow_start"][i]), repr(sorted((acts.args.get(i) or {}).items()))))
    c = trace.counters.columns
    counters = sorted((trace.devices[int(d)].name, trace.counters.strings.strings[int(n)], int(t), float(v))
                      for d, n, t, v in zip(c["device"], c["name"], c["ts"], c["value"], strict=True))
    places = [(d.name, d.pid, d.sort_index, d.label) for d in trace.devices]
    return {"rows": sorted(rows), "places": places, "counters": counters, "metadata": trace.metadata,
            "clock": (trace.epoch_offset_ns, trace.base_time_ns, trace.window)}


def _unplaced(doc):
    """The rows and counter samples without the names and pids of their places."""
    rows = sorted(row[:5] + row[8:] for row in doc["rows"])
    return rows, sorted(sample[1:] for sample in doc["counters"]), doc["metadata"], doc["clock"]


@pytest.mark.parametrize("out_name", ["job.pftrace", "job.pftrace.gz"])
def test_the_packets_rewritten_read_back_as_the_models_merge(rank_files, tmp_path, monkeypatch, out_name):
    fast, rewritten = _merge(rank_files, tmp_path / out_name, monkeypatch)
    model, none = _merge(rank_files, tmp_path / f"model.{out_name}", monkeypatch, model=True)
    assert sorted(rewritten) == sorted(rank_files) and none == [], "every rank rewritten (and none the model's way)"
    got, want = _read_back(tmp_path / out_name), _read_back(tmp_path / f"model.{out_name}")
    assert got == want
    assert fast.events == model.events == 3 * len(overlapping_trace().activities)
    assert {n.split(" · ")[0] for n, *_ in got["places"]} == {"rank 0", "rank 1", "rank 2"}


def test_the_merged_trace_puts_each_rank_on_rank_0s_clock_with_its_ids_apart(rank_files, tmp_path, monkeypatch):
    _merge(rank_files, tmp_path / "job.pftrace", monkeypatch)
    merged = load_trace(tmp_path / "job.pftrace")
    alone = overlapping_trace()
    parsed = Parsed((tmp_path / "job.pftrace").read_bytes(), sequences=None)
    assert not parsed.unclosed and parsed.flow_starts == parsed.flow_ends and sum(parsed.flow_starts.values()) == 9
    processes = {t.process.pid: t.process.process_name for t in parsed.tracks.values() if t.HasField("process")}
    assert processes == {(r + 1) * PID_STRIDE + i: f"rank {r} · node{r % 2} · {name}"
                         for r in range(3) for i, name in enumerate(["CPU", "GPU 0"])}
    names, acts = merged.activities.strings.strings, merged.activities
    rank_of_row = [merged.devices[merged.resources[int(res)].device].pid // PID_STRIDE - 1 for res in acts["resource"]]
    first = {r: min(int(acts["start"][i]) for i in range(len(acts)) if rank_of_row[i] == r) for r in range(3)}
    base_alone = alone.epoch_offset_ns + int(alone.activities["start"].min())
    assert [first[r] + merged.epoch_offset_ns - base_alone for r in range(3)] == [0, -1500, -3000], "by the recorded offsets"
    a_rows = [i for i in range(len(acts)) if names[int(acts["name"][i])] == "B"]
    ext = sorted(int(acts["external_id"][i]) for i in a_rows)
    assert ext == [2, 2 + ID_STRIDE, 2 + 2 * ID_STRIDE]
    kernel_corr = sorted(acts.args.get(i)["correlation"] for i in range(len(acts)) if names[int(acts["name"][i])] == "kernel 10")
    assert kernel_corr == [10, 10 + ID_STRIDE, 10 + 2 * ID_STRIDE], "a correlation arg is shifted as its column"


@pytest.mark.parametrize("read_bytes", [1, 5, 64, 1000])
def test_every_chunk_boundary_gives_the_same_bytes(rank_files, tmp_path, monkeypatch, read_bytes):
    _merge(rank_files, tmp_path / "whole.pftrace", monkeypatch)
    _merge(rank_files, tmp_path / "cut.pftrace", monkeypatch, read_bytes=read_bytes)
    assert (tmp_path / "cut.pftrace").read_bytes() == (tmp_path / "whole.pftrace").read_bytes()


def test_another_writers_trace_and_an_unknown_field_take_the_models_way(rank_files, tmp_path, monkeypatch):
    from test_perfetto_scan import _other_writers_trace

    (tmp_path / "other.pftrace").write_bytes(_other_writers_trace())
    odd = tmp_path / "odd.pftrace"  # polyprof's trace, one packet with a field it never writes (ignored by readers)
    extra = field_bytes(F.TRACE_PACKET, field_varint(F.PACKET_SEQUENCE_ID, 1) + field_varint(99, 5))
    odd.write_bytes(extra + write_trace_bytes(_rank_trace(5)))
    inputs = [*rank_files, str(tmp_path / "other.pftrace"), str(odd)]
    stats, rewritten = _merge(inputs, tmp_path / "job.pftrace", monkeypatch)
    assert sorted(rewritten) == sorted(rank_files), "only polyprof's own, fully known ranks are rewritten"
    assert stats.events == sum(len(load_trace(p).activities) for p in inputs)
    _merge(inputs, tmp_path / "model.pftrace", monkeypatch, model=True)
    assert _read_back(tmp_path / "job.pftrace") == _read_back(tmp_path / "model.pftrace")


def write_trace_bytes(trace) -> bytes:
    from polyprof.formats import dumps_perfetto_trace

    return dumps_perfetto_trace(trace)


def test_mutated_ranks_merge_as_the_model_merges_them_or_are_refused_in_one_line(tmp_path, monkeypatch):
    """300 mutants of rank 1 (cut, bytes changed or inserted; fixed seed) beside a good rank 0: where the
    rewriter takes the mutant, the merge reads back with the events of the model's merge of it (times,
    names, kinds, ids, args; where a mutant contradicts its own layout, a lane named unlike its row or an
    event on another track, the rewriter keeps the places as the descriptors say, the model as the
    layout does); else the model's way merges it or the merge is a one-line TraceFormatError naming
    the file."""
    good = write_trace(_rank_trace(0), str(tmp_path / "rank0.pftrace"))
    data = write_trace_bytes(_rank_trace(1))
    rng = random.Random(1616)
    outcomes = {"rewritten": 0, "model": 0, "refused": 0}
    for case in range(300):
        bad = tmp_path / "rank1.pftrace"
        bad.write_bytes(bytes(mutated(data, rng)))
        try:
            _, rewritten = _merge([good, str(bad)], tmp_path / "job.pftrace", monkeypatch)
        except TraceFormatError as exc:
            assert "\n" not in str(exc) and "rank1.pftrace" in str(exc), case
            outcomes["refused"] += 1
            continue
        if str(bad) not in rewritten:
            outcomes["model"] += 1
            continue
        outcomes["rewritten"] += 1
        _merge([good, str(bad)], tmp_path / "model.pftrace", monkeypatch, model=True)
        got, want = _read_back(tmp_path / "job.pftrace"), _read_back(tmp_path / "model.pftrace")
        assert _unplaced(got) == _unplaced(want), case
    assert all(outcomes.values()), outcomes


def test_a_rank_that_changes_between_the_two_walks_is_refused_and_nothing_is_written(rank_files, tmp_path, monkeypatch):
    real = ranks._describe

    def describe_then_break(path, position):
        found = real(path, position)
        if path.endswith("rank0.pftrace"):  # the file replaced after its first walk
            with open(path, "r+b") as f:
                f.seek(0)
                f.write(field_bytes(F.TRACE_PACKET, field_varint(F.PACKET_SEQUENCE_ID, 1) + field_varint(99, 1))[:4] + b"\xff")
        return found

    monkeypatch.setattr(ranks, "_describe", describe_then_break)
    with pytest.raises(TraceFormatError, match="rank0.pftrace"):
        merge_traces(rank_files, tmp_path / "job.pftrace")
    assert not (tmp_path / "job.pftrace").exists()


def test_json_values_are_rewritten_only_where_the_reader_can_read_them(tmp_path):
    """A rank whose one JSON-valued arg is replaced by 600 seeded 9-byte texts (JSON, near-JSON and
    noise): whenever the rewriter takes the rank as it is, orjson reads the text (so the merged trace
    reads back); texts that are JSON of the usual kinds are taken."""
    import orjson

    trace = _rank_trace(0)
    trace.activities.args.dicts[0] = {"blob": [1234567]}
    data = write_trace_bytes(trace)
    assert data.count(b"[1234567]") == 1
    rng = random.Random(21)  # every text 9 bytes: the packet's lengths stay right
    alphabet = b'[]{}",:0123456789-.eE+\\u' + b"tfnrlsa \x01\xed\xa0\x80\xc3\xa9"
    taken = 0
    for case in range(600):
        text = bytes(rng.choice(alphabet) for _ in range(9)) if case % 3 else rng.choice(
            [b'"\\u00e9x"', b'{"k": 12}', b'[1,2,3.5]', b'[-0.5e+9]', b'"\xc3\xa9abcde"', b'[true,  ]', b"[1e400]  ",
             b'"\\ud800x"', b'[01234567', b'"\xed\xa0\x80abcd"', b'[[[[]]]] ', b"[1, null]"])
        path = tmp_path / "r.pftrace"
        path.write_bytes(data.replace(b"[1234567]", text))
        try:
            rewritable = ranks._describe(str(path), 0)[2]
        except TraceFormatError:  # the reader's way names what is wrong
            rewritable = False
        if rewritable:
            orjson.loads(text)  # raises where the rewriter took what the reader cannot read
            taken += 1
        elif case % 3 == 0 and text in (b'"\\u00e9x"', b'{"k": 12}', b"[1,2,3.5]", b"[-0.5e+9]", b"[[[[]]]] ", b"[1, null]"):
            raise AssertionError(f"JSON the rewriter should take: {text!r}")
    assert taken > 100
