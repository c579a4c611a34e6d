"""open_chunks, the one way a trace's rows are read a chunk at a time: every source (Chrome JSON,
gzip or not, Perfetto, a spill, a Perfetto spill) gives the one Chunk, its rows those of the whole
trace; a C scanner's decline is taken up inside the stream, never by the caller."""

from collections import Counter

import pytest

pytest.importorskip("pyarrow", reason="needs pyarrow (the polyprof[store] extra): the spill helpers write store rows")

from test_store_spill_stream import _settled, _spill  # noqa: E402
from test_store_stream import _job_rank, declining_after  # noqa: E402

import polyprof  # noqa: E402
from polyprof.formats import Chunk, load_trace, open_chunks  # noqa: E402
from polyprof.formats.chrome import scan as chrome_scan  # noqa: E402
from polyprof.formats.perfetto import chunks as perfetto_chunks  # noqa: E402
from polyprof.formats.spill.recover import recover_trace  # noqa: E402


def _names(chunks):
    return Counter(n for c in chunks for n in c.trace.activities.names().tolist())


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sources")
    rank = _settled(_job_rank(seed=11, steps=6))
    found = {name: polyprof.write_trace(rank, str(folder / name)) for name in ("t.json", "t.json.gz", "t.pftrace")}
    found["spill"] = _spill(rank, folder / "run.spill")
    found["perfetto spill"] = _spill(rank, folder / "run.spill.pftrace", perfetto=True)
    return found


@pytest.mark.parametrize("which", ["t.json", "t.json.gz", "t.pftrace", "spill", "perfetto spill"])
def test_every_source_is_one_stream_of_chunks_whose_rows_are_the_whole_traces(sources, which, monkeypatch):
    if which in ("t.pftrace", "perfetto spill") and polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension (a .pftrace is read in chunks by its packet scanner)")
    path = sources[which]
    want = recover_trace(path) if "spill" in which else load_trace(path)
    (one,) = open_chunks(path)  # rows=None: one chunk, the whole trace
    assert isinstance(one, Chunk) and len(one.trace.activities) == len(want.activities) and one.window == want.window
    monkeypatch.setattr(chrome_scan, "CHUNK", 2048)  # the scanners read a few events at a time
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 512)
    chunks = list(open_chunks(path, rows=40))
    assert len(chunks) > 3 and all(isinstance(c, Chunk) and not c.restarted for c in chunks), which
    assert _names(chunks) == _names([one]) and sum(len(c.trace.activities) for c in chunks) == len(want.activities)


def test_a_perfetto_file_the_scanner_declines_part_way_is_read_whole_and_says_it_restarted(sources, monkeypatch):
    if polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension (a .pftrace is read in chunks by its packet scanner)")
    monkeypatch.setattr(perfetto_chunks, "perfetto_chunks", declining_after(perfetto_chunks.perfetto_chunks, 1))
    monkeypatch.setattr(perfetto_chunks, "FEED_BYTES", 512)
    chunks = list(open_chunks(sources["t.pftrace"], rows=40))
    assert [c.restarted for c in chunks] == [False, True], "one chunk, then the whole trace read again"
    assert len(chunks[1].trace.activities) == len(load_trace(sources["t.pftrace"]).activities)
