"""A rank's trace (JSON, or polyprof's .pftrace) streamed into the store (polyprof.formats.store.rank_stream) gives,
row for row, the tables of the trace loaded whole (rank_tables), however the file is cut into chunks
and however the engine hands the sorted rows back: steps, nesting levels, device rows' launch steps,
flows, collectives, counters and the rank's row."""

import gzip
import json
import os

import pytest

pa = pytest.importorskip("pyarrow", reason="needs pyarrow (the polyprof[store] extra)")
pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import polyprof  # noqa: E402
from polyprof import store  # noqa: E402
from polyprof.errors import TraceFormatError  # noqa: E402
from polyprof.formats import open_chunks  # noqa: E402
from polyprof.formats.chrome import scan  # noqa: E402
from polyprof.formats.perfetto import chunks as perfetto_chunks  # noqa: E402
from polyprof.formats.perfetto import fields as F  # noqa: E402
from polyprof.formats.perfetto.wire import fields, read_varint  # noqa: E402
from polyprof.formats.store import rank_stream  # noqa: E402
from polyprof.formats.store import write as store_write  # noqa: E402
from polyprof.formats.store.files import write_rank  # noqa: E402
from polyprof.formats.store.rank_tables import rank_tables  # noqa: E402
from polyprof.formats.store.schema import TABLES  # noqa: E402
from polyprof.model import FLOW_AC2G, ActivityBuilder, ActivityKind, Device, Resource, Trace  # noqa: E402

K = ActivityKind
#: a .pftrace streams through the C packet scanner (without it, the store loads the file whole)
needs_scanner = pytest.mark.skipif(polyprof._native.extension is None, reason="needs polyprof's C extension")
JSON_COLUMNS = ("input_dims", "input_types", "args", "metadata", "status")


def _job_rank(seed=7, steps=12):
    """A rank with what the tables are made of: steps on the training thread, nested and badly nested
    ops on two threads (equal starts, zero-length rows), launches whose kernels run after their step
    ended, flows, all-reduces with their args, instants and counters; distributedInfo says rank 2."""
    rng = np.random.default_rng(seed)
    b = ActivityBuilder()
    t, corr = 1_000_000, 1
    for step in range(steps):
        step_start = t
        for op in range(int(rng.integers(5, 15))):
            thread = int(rng.integers(0, 2))
            start = t + int(rng.integers(0, 3)) * 1_000
            b.append(K.CPU_OP, "cpu_op", f"aten::op{op % 4}", 0, thread, start, start + 40_000,
                             args={"Input Dims": [[4, 4]], "Input type": ["float"], "Sequence number": op})
            b.append(K.CPU_OP, "cpu_op", "aten::inner", 0, thread, start, start + int(rng.integers(0, 40_000)))
            b.append(K.CPU_OP, "cpu_op", "aten::zero", 0, thread, start + 5_000, start + 5_000)
            if rng.random() < 0.2:  # starts inside the op and ends after it: not nested
                b.append(K.USER_ANNOTATION, "user_annotation", "overlap", 0, thread, start + 30_000, start + 60_000)
            b.append(K.RUNTIME, "cuda_runtime", "cudaLaunchKernel", 0, thread, start + 10_000, start + 12_000,
                     correlation=corr, external_id=corr, flow_id=corr, flow_type=FLOW_AC2G, flow_start=True)
            late = int(rng.integers(0, 400_000))  # often after the step's end
            b.append(K.KERNEL, "kernel", "gemm", 1, 2, start + 20_000 + late, start + 30_000 + late,
                     correlation=corr, external_id=corr, flow_id=corr, flow_type=FLOW_AC2G)
            if op % 5 == 4:
                b.append(K.INSTANT, "instant", "mark", 0, thread, start + 1_000, start + 1_000, args={"op": op})
            corr += 1
            t += 50_000
        b.append(K.CPU_OP, "gloo", "gloo:all_reduce", 0, 0, t, t + 20_000,
                 args={"Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 256,
                       "Out msg nelems": 256, "dtype": "Float", "Group size": 4})
        t += 30_000
        b.append(K.USER_ANNOTATION, "user_annotation", f"ProfilerStep#{step}", 0, 0, step_start, t)
        t += 5_000
    trace = Trace(activities=b.freeze(),
                  devices=[Device("host", "cpu", 0, "host"), Device("cuda:0", "gpu", 0, "GPU 0")],
                  resources=[Resource(0, 11, "main"), Resource(0, 12, "loader"), Resource(1, 7, "stream 7")])
    for i in range(50):
        trace.counters.add("memory", 0, 1_000_000 + i * 30_000, float(i * 1024))
    trace.metadata["distributedInfo"] = {"rank": 2, "world_size": 4}
    return trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """The rank above as polyprof writes it (plain and gzip), and a torch.profiler trace of a few
    training steps (shapes, fwd-bwd flows), where torch is installed."""
    folder = tmp_path_factory.mktemp("stream")
    out = {"polyprof": str(folder / "rank2.json")}
    polyprof.write_trace(_job_rank(), out["polyprof"])
    with open(out["polyprof"], "rb") as f, gzip.open(folder / "rank2.json.gz", "wb") as g:
        g.write(f.read())
    out["gzip"] = str(folder / "rank2.json.gz")
    out["pftrace"] = str(folder / "rank2.pftrace")
    polyprof.write_trace(_job_rank(), out["pftrace"])
    with open(out["pftrace"], "rb") as f, gzip.open(folder / "rank2.pftrace.gz", "wb") as g:
        g.write(f.read())
    out["pftrace gzip"] = str(folder / "rank2.pftrace.gz")
    try:
        import torch
    except ImportError:
        return out
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    path = str(folder / "torch.json")
    sched = torch.profiler.schedule(wait=0, warmup=1, active=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(4):
            with torch.profiler.record_function("forward"):
                loss = model(torch.randn(8, 32)).sum()
            loss.backward()
            prof.step()
    out["torch"] = path
    return out


def _tables(folder, rank):
    return {name: pq.read_table(os.path.join(folder, name, f"rank={rank}", "part-0.parquet")) for name in TABLES}


def _rows(table, parse_json):
    rows = table.to_pylist()
    if parse_json:  # the reference reader writes args as compact JSON, the scanner keeps the file's text
        for row in rows:
            for key in JSON_COLUMNS:
                if row.get(key) is not None:
                    row[key] = json.loads(row[key])
    return rows


def _assert_same_tables(source, tmp_path, parse_json=False, **options):
    loaded, streamed = tmp_path / "loaded", tmp_path / "streamed"
    tables = rank_tables(polyprof.load_trace(source), source=os.path.abspath(source))
    rows = write_rank(tables, str(loaded))
    streamed.mkdir()
    rank, streamed_rows = rank_stream.stream_rank(source, str(streamed), **options)
    assert (rank, streamed_rows) == (tables.rank, rows)
    want, got = _tables(loaded, rank), _tables(streamed, rank)
    for name in TABLES:
        assert got[name].schema == want[name].schema, name
        assert _rows(got[name], parse_json) == _rows(want[name], parse_json), name
    return want


@pytest.mark.parametrize("which", ["polyprof", "gzip", "torch", "pftrace", "pftrace gzip"])
def test_a_rank_streamed_in_many_chunks_has_the_tables_of_the_loaded_trace(traces, which, tmp_path, monkeypatch):
    if which not in traces:
        pytest.skip("needs torch (CPU build) for a torch.profiler trace")
    if which.startswith("pftrace") and polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension (a .pftrace streams through its packet scanner)")
    monkeypatch.setattr(scan, "CHUNK", 2048)  # the scanner reads 2 KB at a time: a chunk every few events
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 512)  # likewise, the packet scanner 512 bytes
    monkeypatch.setattr(rank_stream, "ENGINE_BATCH_ROWS", 7)  # the levels' stack carried across batches
    want = _assert_same_tables(traces[which], tmp_path, chunk_events=1)
    acts = want["activities"].to_pylist()
    assert {r["level"] for r in acts} >= {0, 1} and any(r["flow_id"] for r in acts)
    if which != "torch":
        late = [r for r in acts if r["kind"] == "kernel" and r["step"] >= 0]
        assert want["collectives"].num_rows == 12 and want["counters"].num_rows == 50 and len(late) > 12
        assert any(r["start_ns"] >= max(s["end_ns"] for s in acts if s["name"] == f"ProfilerStep#{r['step']}")
                   for r in late), "some kernels run after their launch's step ended and still count in it"


def test_the_reference_reader_streams_what_the_scanner_declines(traces, tmp_path, monkeypatch):
    def declined(path, rows, on_read=None):
        raise scan.Declined
        yield  # pragma: no cover

    monkeypatch.setattr(scan, "scan_chunks", declined)
    _assert_same_tables(traces["polyprof"], tmp_path, parse_json=True, chunk_events=5)


def declining_after(reader, given):
    """`reader` (a chunk reader's function), declining once it has given `given` chunks."""

    def chunks(path, rows, on_read=None):
        for n, chunk in enumerate(reader(path, rows, on_read)):
            if n == given:
                raise scan.Declined
            yield chunk

    return chunks


@needs_scanner
def test_a_scanner_that_declines_part_way_is_read_again_and_its_first_chunks_do_not_count(traces, tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "scan_chunks", declining_after(scan.scan_chunks, 2))
    monkeypatch.setattr(scan, "CHUNK", 2048)  # a chunk every few events
    chunks = list(open_chunks(traces["polyprof"], 5))
    assert [c.restarted for c in chunks][:3] == [False, False, True] and not any(c.restarted for c in chunks[3:])
    assert sum(len(c.trace.activities) for c in chunks[2:]) == len(polyprof.load_trace(traces["polyprof"]).activities)
    _assert_same_tables(traces["polyprof"], tmp_path, parse_json=True, chunk_events=5)


@pytest.mark.parametrize("reader", ["scanner", "reference"])
def test_a_truncated_trace_streamed_is_one_line_and_leaves_no_store(traces, tmp_path, monkeypatch, reader):
    monkeypatch.setattr(store_write, "STREAM_ABOVE_BYTES", 0)
    if reader == "reference":
        monkeypatch.setattr(scan, "scan_chunks", lambda *args: (_ for _ in ()).throw(scan.Declined()))
    data = open(traces["polyprof"], "rb").read()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="cut.json: is truncated"):
        store.write_store([cut], tmp_path / "job.polyprof", jobs=1)
    assert not (tmp_path / "job.polyprof").exists() and os.listdir(tmp_path) == ["cut.json"]


def test_a_truncated_pftrace_is_declined_by_the_stream_and_named_by_the_reader(traces, tmp_path, monkeypatch):
    monkeypatch.setattr(store_write, "STREAM_ABOVE_BYTES", 0)
    data = open(traces["pftrace"], "rb").read()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="cut.pftrace: packet .* past the end of the file"):
        store.write_store([cut], tmp_path / "job.polyprof", jobs=1)
    assert os.listdir(tmp_path) == ["cut.pftrace"]


@pytest.mark.parametrize("which", ["polyprof", "pftrace"])
def test_the_store_streams_the_ranks_above_the_size_it_loads(traces, which, tmp_path, monkeypatch):
    streamed = []

    def counted(source, out, **options):
        streamed.append(os.path.basename(source))
        return stream_rank(source, out, **options)

    stream_rank = rank_stream.stream_rank
    monkeypatch.setattr(rank_stream, "stream_rank", counted)
    store.write_store([traces[which]], tmp_path / "loaded.polyprof", jobs=1)
    assert streamed == []
    monkeypatch.setattr(store_write, "STREAM_ABOVE_BYTES", os.path.getsize(traces[which]) - 1)
    store.write_store([traces[which]], tmp_path / "streamed.polyprof", jobs=1)
    assert streamed == [os.path.basename(traces[which])]
    for name in TABLES:
        assert (_tables(tmp_path / "streamed.polyprof", 2)[name].to_pylist()
                == _tables(tmp_path / "loaded.polyprof", 2)[name].to_pylist()), name


@pytest.mark.parametrize("which", ["polyprof", "gzip", "pftrace"])
def test_a_streamed_rank_reports_its_files_bytes_as_it_reads_them(traces, which, tmp_path, monkeypatch):
    from polyprof import progress

    monkeypatch.setattr(store_write, "STREAM_ABOVE_BYTES", 0)
    monkeypatch.setattr(scan, "CHUNK", 2048)
    monkeypatch.setattr(rank_stream, "CHUNK_EVENTS", 20)
    tasks = []

    def make_task(description, total):
        tasks.append((description, total, []))
        return tasks[-1][2].append

    with progress.listening(make_task):
        store.write_store([traces[which]], tmp_path / "job.polyprof", jobs=1)
    [(description, total, amounts)] = tasks
    assert description == "stored trace bytes" and total == os.path.getsize(traces[which])
    assert sum(amounts) == total and min(amounts) > 0
    # (gzip reads its file ahead in 128 KB blocks, the reference reader 64 KB: a small file at once)
    if which == "polyprof" and polyprof._native.extension is not None:
        assert len(amounts) > 3, "bytes reported as chunks are read"


def _packets(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        _, at = read_varint(data, pos)
        size, at = read_varint(data, at)
        out.append(data[pos : at + size])
        pos = at + size
    return out


def _event(packet: bytes) -> dict[int, int]:
    """A TrackEvent packet's timestamp and its event's varint fields ({} for another packet)."""
    _, at = read_varint(packet, 0)
    _, at = read_varint(packet, at)
    top = {n: v for n, _, v in fields(packet[at:])}
    if F.PACKET_TRACK_EVENT not in top:
        return {}
    return {"ts": top.get(F.PACKET_TIMESTAMP, 0), **{n: v for n, _, v in fields(top[F.PACKET_TRACK_EVENT])
                                                     if isinstance(v, int)}}


@pytest.fixture(scope="module")
def ties_pftrace(tmp_path_factory):
    """A .pftrace whose rows tie where only the reader's order tells them apart: slices of one start and
    end on two threads, a zero-length slice and an instant at one time, and a slice whose end was never
    written (the reader ends it at the trace's last time, with finished: false)."""
    b = ActivityBuilder()
    for i in range(30):
        t = 1_000 + i * 100
        for thread in (0, 1):
            b.append(K.CPU_OP, "cpu_op", f"op{i % 3}", 0, thread, t, t + 50)
        b.append(K.INSTANT, "instant", "mark", 0, i % 2, t, t)
        b.append(K.CPU_OP, "cpu_op", "zero", 0, (i + 1) % 2, t, t)
    b.append(K.USER_ANNOTATION, "user_annotation", "never ended", 0, 0, 500, 9_999)
    trace = Trace(activities=b.freeze(), devices=[Device("host", "cpu", 0, "host")],
                  resources=[Resource(0, 11, "main"), Resource(0, 12, "loader")])
    folder = tmp_path_factory.mktemp("ties")
    whole = str(folder / "whole.pftrace")
    polyprof.write_trace(trace, whole)
    packets = _packets(open(whole, "rb").read())
    [never] = [i for i, p in enumerate(packets) if _event(p).get(F.EVENT_TYPE) == F.TYPE_SLICE_END
               and _event(p)["ts"] == 9_999]
    path = str(folder / "ties.pftrace")
    with open(path, "wb") as f:
        f.write(b"".join(p for i, p in enumerate(packets) if i != never))
    return path


@needs_scanner
def test_perfetto_chunks_order_their_rows_as_the_whole_file_is_read(ties_pftrace, monkeypatch):
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 64)
    got = list(perfetto_chunks.perfetto_chunks(ties_pftrace, 1))
    assert len(got) > 20
    rows = [(int(s), int(e), c.trace.activities.strings.strings[int(n)], int(r), int(k))
            for c in got for s, e, n, r, k in zip(c.trace.activities["start"], c.trace.activities["end"],
                                                   c.trace.activities["name"], c.trace.activities["resource"],
                                                   c.rows, strict=True)]
    rows.sort(key=lambda row: (row[0], -row[1], row[4]))
    loaded = polyprof.load_trace(ties_pftrace).activities
    want = [(int(s), int(e), loaded.strings.strings[int(n)], int(r))
            for s, e, n, r in zip(loaded["start"], loaded["end"], loaded["name"], loaded["resource"], strict=True)]
    assert [row[:4] for row in rows] == want
    last = got[-1].trace.activities
    [never] = np.flatnonzero(last["start"] == 500).tolist()  # the slice never ended comes last
    assert last.args[never] == {"finished": False} and int(last["end"][never]) == max(row[1] for row in rows)
    assert len({row[4] for row in rows}) == len(rows)


@needs_scanner
def test_a_pftrace_with_ties_and_a_slice_never_ended_streams_as_it_loads(ties_pftrace, tmp_path, monkeypatch):
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 64)
    monkeypatch.setattr(rank_stream, "ENGINE_BATCH_ROWS", 5)
    want = _assert_same_tables(ties_pftrace, tmp_path, chunk_events=1)
    assert any(r["args"] == '{"finished":false}' for r in want["activities"].to_pylist())


@needs_scanner
def test_another_writers_pftrace_streams_as_it_loads(tmp_path, monkeypatch):
    """No polyprof layout: rows placed by the descriptors (a track without one gets a row when met),
    the window the rows' extent; nested slices, one never ended, an end without a begin, counters."""
    from test_perfetto_scan import _other_writers_trace

    path = tmp_path / "other.pftrace"
    path.write_bytes(_other_writers_trace())
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 16)
    want = _assert_same_tables(str(path), tmp_path, chunk_events=1)
    assert want["activities"].num_rows > 3 and want["counters"].num_rows > 0


@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
def test_a_chunks_string_table_holds_the_strings_its_rows_name(tmp_path, suffix, monkeypatch):
    """Each chunk pays for its own strings, not for every string read before it (a trace of Python
    calls names hundreds of thousands)."""
    if polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension (its scanners read in chunks)")
    monkeypatch.setattr(scan, "CHUNK", 2048)
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 512)
    b = ActivityBuilder()
    for i in range(3_000):
        b.append(K.CPU_OP, "cpu_op", f"fn{i}", 0, 0, 1_000 * i, 1_000 * i + 500)
    path = str(tmp_path / f"calls{suffix}")
    polyprof.write_trace(Trace(activities=b.freeze(), devices=[Device("host", "cpu", 0, "host")],
                               resources=[Resource(0, 1, "main")]), path)
    if suffix == ".json":
        chunks = [c.trace for c in scan.scan_chunks(path, 100)]
    else:
        chunks = [c.trace for c in perfetto_chunks.perfetto_chunks(path, 100)]
    assert sum(len(c.activities) for c in chunks) == 3_000 and len(chunks) >= 20
    for chunk in chunks:
        named = set(chunk.activities.names().tolist()) | {"cpu_op", ""}
        assert set(chunk.activities.strings.strings) <= named
