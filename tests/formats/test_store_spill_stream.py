"""A spill (what a killed run leaves) streamed into the store a span of time at a time
(polyprof.formats.spill.recover_stream) gives, row for row, the tables of the trace `polyprof recover` merges
from the whole spill: launches attributed to the operators open around them, flows paired across the
parts of different flushes, device-side annotations, steps, counters and the backends' counts."""

import os
import shutil
import time

import numpy as np
import pytest

pytest.importorskip("pyarrow", reason="needs pyarrow (the polyprof[store] extra)")
pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")

from test_store_stream import _job_rank, _rows, _tables  # noqa: E402

import polyprof  # noqa: E402
from polyprof.formats.perfetto import chunks as perfetto_chunks  # noqa: E402
from polyprof.formats.perfetto import scan as perfetto_scan  # noqa: E402
from polyprof.formats.spill import recover_stream  # noqa: E402
from polyprof.formats.spill.file import SpillWriter  # noqa: E402
from polyprof.formats.spill.perfetto import PerfettoSpill  # noqa: E402
from polyprof.formats.spill.recover import recover_trace  # noqa: E402
from polyprof.formats.store import rank_stream  # noqa: E402
from polyprof.formats.store import write as store_write  # noqa: E402
from polyprof.formats.store.files import write_rank  # noqa: E402
from polyprof.formats.store.rank_tables import rank_tables  # noqa: E402
from polyprof.formats.store.schema import TABLES  # noqa: E402
from polyprof.model import FLOW_FWDBWD, ActivityKind, ActivityTable, BackendStatus, CollectedPart, Counters  # noqa: E402

K = ActivityKind


def _spill(trace, path, flushes=9, perfetto=False):
    """`trace` as a run's spill after a kill: at each of `flushes` hand-overs, the host backend's rows
    that ended by then, and the device backend's launches with their kernels once the kernel ended (as
    CUPTI's buffers come); no end marker. `perfetto`: the spill of a .pftrace output (each hand-over
    appended as Perfetto packets on a sequence of its own)."""
    acts = trace.activities
    start, end, kind = acts["start"], acts["end"], acts["kind"]
    device_side = (kind == int(K.RUNTIME)) | (acts["device"] != 0)
    handed = end.copy()
    launches = np.flatnonzero(kind == int(K.RUNTIME))
    kernels = {int(c): int(e) for c, e, k in zip(acts["correlation"], end, kind, strict=True) if k == int(K.KERNEL)}
    handed[launches] = [kernels[int(c)] for c in acts["correlation"][launches]]
    edges = np.linspace(int(start.min()), int(end.max()), flushes + 1)[1:].astype(np.int64)
    flush_of = np.searchsorted(edges, handed, side="left")
    counters = trace.counters.columns
    counter_flush = np.searchsorted(edges, counters["ts"], side="left")
    writer = (PerfettoSpill if perfetto else SpillWriter).create(str(path), {"version": "0", "pid": 7, "epoch_offset_ns": trace.epoch_offset_ns,
                                            "activities": ["cpu", "cuda"], "flush_interval_s": 1.0,
                                            "metadata": trace.metadata})
    writer.append_window({"window_start": int(start.min()), "backends": ["torch", "cuda"], "flushing": ["torch", "cuda"]})
    for i in range(flushes):
        parts = []
        for backend, mask in (("torch", ~device_side), ("cuda", device_side)):
            samples = (counter_flush == i) if backend == "torch" else np.zeros(len(counter_flush), dtype=bool)
            part_counters = Counters.from_columns(trace.counters.strings, {k: v[samples] for k, v in counters.items()})
            status = BackendStatus(backend, warnings=[f"flush {j}" for j in range(i + 1)])  # its counts so far
            parts.append(CollectedPart(backend, status, acts.take(np.flatnonzero(mask & (flush_of == i))),
                                       devices=tuple(trace.devices), resources=tuple(trace.resources),
                                       counters=part_counters))
        writer.append_parts(parts)
    writer.close(clean=False)
    return str(path)


def _settled(trace, late_every=4):
    """`trace` with the kernels of most steps run right after their launch (those of every
    `late_every`-th step stay late, past their step's end): moments with no flow across them."""
    acts = trace.activities
    cols = {k: v.copy() for k, v in acts.columns.items()}
    kind, names = cols["kind"], acts.names()
    steps = np.sort(cols["start"][np.char.startswith(names.astype(str), "ProfilerStep#")])
    launch_at = {int(c): (int(s), int(e)) for c, s, e, k in zip(cols["correlation"], cols["start"], cols["end"], kind,
                                                                  strict=True) if k == int(K.RUNTIME)}
    step_ends = {int(s): int(e) for s, e, n in zip(cols["start"], cols["end"], names.astype(str), strict=True)
                 if n.startswith("ProfilerStep#")}
    kernels = np.flatnonzero(kind == int(K.KERNEL))
    launched_in = {int(row): np.searchsorted(steps, launch_at[int(cols["correlation"][row])][0], side="right") - 1
                   for row in kernels}
    last_of = {step: row for row, step in launched_in.items()}
    for row in kernels:
        launch_start, launch_end = launch_at[int(cols["correlation"][row])]
        step = launched_in[int(row)]
        length = cols["end"][row] - cols["start"][row]
        if not step % late_every:  # late, the last one starting 2 us after its step ended, before the next
            step_end = step_ends[int(steps[step])]
            cols["start"][row] = step_end + 2_000 if last_of[step] == row else min(cols["start"][row], step_end + 1_000)
            cols["end"][row] = cols["start"][row] + length
        else:
            cols["start"][row] = launch_end + 1_000
            cols["end"][row] = launch_end + 1_000 + length
    # and a forward-backward flow from each step's first operator to its last, whose ids collide with
    # the launches': the merge shifts those past the highest of the whole trace
    step_of = np.searchsorted(steps, cols["start"], side="right") - 1
    ops = np.flatnonzero((kind == int(K.CPU_OP)) & np.char.startswith(names.astype(str), "aten::op"))
    for step in np.unique(step_of[ops]):
        mine = ops[step_of[ops] == step]
        for row, is_start in ((mine[0], True), (mine[-1], False)):
            cols["flow_id"][row], cols["flow_type"][row], cols["flow_start"][row] = step + 1, FLOW_FWDBWD, is_start
    trace.activities = ActivityTable(acts.strings, cols, acts.args)
    return trace


def _assert_streams_as_recovered(spill, tmp_path, rows):
    loaded, streamed = tmp_path / "loaded", tmp_path / "streamed"
    tables = rank_tables(recover_trace(spill), source=os.path.abspath(spill))
    written = write_rank(tables, str(loaded))
    streamed.mkdir()
    read = []
    rank, streamed_rows = rank_stream.stream_rank(spill, str(streamed), chunk_events=rows, on_read=read.append)
    assert (rank, streamed_rows) == (tables.rank, written)
    want, got = _tables(loaded, rank), _tables(streamed, rank)
    for name in TABLES:
        assert got[name].schema == want[name].schema, name
        assert _rows(got[name], False) == _rows(want[name], False), name
    assert read == sorted(read) and read[-1] == os.path.getsize(spill), "the file's bytes, in order, to its size"
    return want


def _pieces(spill, rows):
    return [len(p.trace.activities) for p in recover_stream.recover_pieces(spill, rows)]


def test_a_spill_streamed_in_pieces_of_time_has_the_tables_of_the_recovered_trace(tmp_path):
    spill = _spill(_settled(_job_rank(seed=3, steps=40)), tmp_path / "run.spill")
    pieces = _pieces(spill, 8)
    assert len([n for n in pieces if n]) >= 10, f"the spill was cut into pieces of time: {pieces}"
    want = _assert_streams_as_recovered(spill, tmp_path, rows=8)
    acts = want["activities"].to_pylist()
    kernels = [r for r in acts if r["kind"] == "kernel"]
    assert kernels and all(r["external_id"] for r in kernels) and any(r["flow_id"] for r in kernels)
    fwdbwd = [r["flow_id"] for r in acts if r["flow_type"] == FLOW_FWDBWD]
    assert len(fwdbwd) == 80 and min(r["flow_id"] for r in kernels) > max(fwdbwd), "the launches' shifted past them"
    assert want["counters"].num_rows == 50 and want["collectives"].num_rows == 40
    counted = {r["backend"]: r["activities"] for r in want["backends"].to_pylist()}
    assert all(r["warnings"].count("flush") == 9 for r in want["backends"].to_pylist()), "the latest status"
    assert sum(counted.values()) == len(acts) - sum(r["kind"] == "gpu_user_annotation" for r in acts) and len(counted) == 2


def test_a_torn_spill_streams_what_recover_reads_of_it(tmp_path):
    whole = _spill(_settled(_job_rank(seed=6, steps=10)), tmp_path / "whole.spill")
    data = open(whole, "rb").read()
    torn = tmp_path / "torn.spill"
    torn.write_bytes(data[: len(data) * 2 // 3])  # the kill came in the middle of a chunk
    assert recover_trace(str(torn)).metadata["polyprof"]["partial"]["torn_bytes"] > 0
    _assert_streams_as_recovered(str(torn), tmp_path, rows=10)


@pytest.mark.parametrize("torn", [False, True])
def test_a_perfetto_spill_streams_as_it_is_recovered_by_the_scanner_and_the_reader(tmp_path, monkeypatch, torn):
    """The spill of a .pftrace output (300 hand-overs: more packet sequences than the scanner once
    kept), maybe cut short by the kill: `polyprof recover` reads it with the C packet scanner as the
    reference reader does, and the store streams it as it is recovered."""
    if polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension (its packet scanner)")
    spill = tmp_path / ".run.spill.pftrace"
    _spill(_job_rank(seed=9, steps=40), spill, flushes=300, perfetto=True)
    if torn:
        spill.write_bytes(spill.read_bytes()[:-5])  # a write cut short by the kill
    spill = str(spill)
    assert perfetto_scan.scan_torn([open(spill, "rb").read()], spill) is not None, "the scanner reads it"
    scanned = recover_trace(spill)
    partial = scanned.metadata["polyprof"]["partial"]
    assert partial["chunks"] > 256 and (partial["torn_bytes"] > 0) == torn
    with monkeypatch.context() as m:
        m.setattr(perfetto_scan, "scan_torn", lambda *a: None)  # the reference reader, as before the scanner
        read = recover_trace(spill)
    assert read.metadata == scanned.metadata
    for which, trace in (("scanner", scanned), ("reader", read)):
        write_rank(rank_tables(trace, source=os.path.abspath(spill)), str(tmp_path / which))
    for name in TABLES:
        assert _rows(_tables(tmp_path / "scanner", 0)[name], False) == _rows(_tables(tmp_path / "reader", 0)[name], False)
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 512)  # a chunk every few events
    _assert_streams_as_recovered(spill, tmp_path, rows=10)


def test_a_spill_killed_before_its_first_hand_over_streams_as_it_is_recovered(tmp_path):
    writer = SpillWriter.create(str(tmp_path / "run.spill"), {"version": "0", "pid": 7, "epoch_offset_ns": 0})
    writer.append_window({"window_start": 5})
    writer.close(clean=False)
    want = _assert_streams_as_recovered(str(tmp_path / "run.spill"), tmp_path, rows=10)
    assert want["activities"].num_rows == 0 and want["ranks"].num_rows == 1


def test_a_spill_without_a_moment_to_cut_at_is_one_piece_and_still_the_same(tmp_path):
    trace = _job_rank(seed=4, steps=6)
    acts = trace.activities
    first, last = int(acts["start"].min()), int(acts["end"].max())
    train = {name: np.zeros(1, dtype=v.dtype) for name, v in acts.columns.items()}
    train.update(kind=np.array([int(K.USER_ANNOTATION)], dtype=acts["kind"].dtype), start=np.array([first]),
                 end=np.array([last]), correlation=np.array([999_999]),
                 cat=np.array([acts.strings.intern("user_annotation")], dtype=np.int32),
                 name=np.array([acts.strings.intern("train")], dtype=np.int32))
    trace.activities = ActivityTable(acts.strings, {k: np.concatenate([v, train[k].astype(v.dtype)])
                                                    for k, v in acts.columns.items()}, acts.args)
    spill = _spill(trace, tmp_path / "run.spill")
    assert [n for n in _pieces(spill, 10) if n] == [len(recover_trace(spill).activities)], "one piece of rows"
    _assert_streams_as_recovered(spill, tmp_path, rows=10)


def test_the_store_streams_a_large_spill_and_loads_a_rings(tmp_path, monkeypatch):
    spill = _spill(_job_rank(seed=5, steps=10), tmp_path / "run.spill")
    monkeypatch.setattr(store_write, "STREAM_ABOVE_BYTES", 0)
    streamed = []
    real = recover_stream.recover_pieces
    monkeypatch.setattr(recover_stream, "recover_pieces", lambda *a, **k: streamed.append(a[0]) or real(*a, **k))
    store_write.write_store([spill], tmp_path / "job.polyprof")
    assert streamed == [spill]
    open(spill + ".previous", "wb").close()  # a ring's older generation: loaded whole, as recover reads it
    with pytest.raises(recover_stream.Declined, match="older generation"):
        next(recover_stream.recover_pieces(spill, 10))


def test_a_real_runs_spill_streams_as_it_is_recovered(tmp_path):
    """A training loop recorded with torch's operators (shapes, forward-backward flows) and annotations,
    its rows handed over every 20 ms; the spill copied while the profile records (as a kill leaves it)."""
    torch = pytest.importorskip("torch", reason="needs torch (CPU build)")
    recording, spill = tmp_path / "run.spill", str(tmp_path / "killed.spill")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = polyprof.profile(["cpu"], spill=recording, flush_interval_s=0.02, record_shapes=True)
    prof.start()
    try:
        for step in range(30):
            with polyprof.record_function(f"step {step}"):
                loss = model(torch.randn(16, 64)).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            time.sleep(0.005)
        time.sleep(0.2)  # the last rows handed over
        shutil.copyfile(recording, spill)
    finally:
        prof.stop()
    pieces = _pieces(spill, 200)
    assert len([n for n in pieces if n]) >= 3, f"the spill was cut into pieces of time: {pieces}"
    want = _assert_streams_as_recovered(spill, tmp_path, rows=200)
    acts = want["activities"].to_pylist()
    assert any(r["flow_type"] == FLOW_FWDBWD for r in acts) and any(r["input_dims"] for r in acts)
    assert sum(r["name"].startswith("step ") for r in acts) == 30


def test_a_parts_args_come_back_from_the_spill_and_the_first_pass_skips_them():
    from polyprof.formats.spill.file import decode_part, encode_part
    from polyprof.model.args import Args, ArgsBlock, JSONArray

    trace = _job_rank(seed=8, steps=2)
    acts = trace.activities
    rows = np.arange(0, len(acts), 3, dtype=np.int64)
    block = ArgsBlock(rows, ("Sequence number", "Input Dims", "dtype"), [
        rows * 7, JSONArray.of([b'[[4,4],[]]' if r % 2 else b"" for r in rows], len(rows)),
        np.array(["float" if r % 2 else None for r in rows] + [None], dtype=object)[:-1]])
    args = Args({1: {"a": [1, "b"]}}, [block])
    part = CollectedPart("torch", BackendStatus("torch"), ActivityTable(acts.strings, acts.columns, args),
                         devices=tuple(trace.devices), resources=tuple(trace.resources))
    back = decode_part(encode_part(part)).activities
    assert [back.args.get(r, {}) for r in range(len(acts))] == [args.get(r, {}) for r in range(len(acts))]
    assert any(a.get("Input Dims") == [[4, 4], []] for a in back.args.values())
    light = decode_part(encode_part(part), args=False).activities
    assert not light.args and all(np.array_equal(light[c], acts[c]) for c in acts.columns)


def test_reading_a_spill_as_a_trace_says_how_to_recover_it(tmp_path):
    from polyprof.errors import TraceFormatError

    spill = _spill(_job_rank(seed=2, steps=4), tmp_path / "run.spill", flushes=3)
    with pytest.raises(TraceFormatError, match=r"a polyprof spill .* `polyprof recover .*run.spill` writes its trace"):
        polyprof.load_trace(spill)
    torn = tmp_path / ".run.spill.pftrace"
    _spill(_job_rank(seed=2, steps=4), torn, flushes=3, perfetto=True)
    torn.write_bytes(torn.read_bytes()[:-5])
    with pytest.raises(TraceFormatError, match=r"past the end of the file.*a spill a kill cut short: `polyprof recover"):
        polyprof.load_trace(str(torn))
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "polyprof", "summary", spill], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "polyprof recover" in run.stderr and "Traceback" not in run.stderr
