"""A store's analyses computed a batch of ranks at a time (polyprof.store.plan) are the whole-store
queries' answers, row for row, whatever the batches; steps meet the rows that overlap them, however
odd the steps."""

import pytest

pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")

from test_store_analyses import random_trace  # noqa: E402

from polyprof import store  # noqa: E402
from polyprof.analysis.steps import step_breakdown  # noqa: E402
from polyprof.formats import write_trace  # noqa: E402
from polyprof.model import ActivityBuilder, ActivityKind, Device, Resource, Trace  # noqa: E402
from polyprof.store import plan  # noqa: E402
from polyprof.store.query import ANALYSES, Store, analysis_sql  # noqa: E402

K = ActivityKind


@pytest.fixture(scope="module")
def job_store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    files = []
    for rank in range(3):
        files.append(str(folder / f"rank{rank}.json"))
        write_trace(random_trace(20261207 + rank, rank), files[-1])
    store.write_store(files, folder / "job.polyprof", jobs=1)
    return folder / "job.polyprof"


def _rows(table):
    return table.to_pylist()


@pytest.mark.parametrize("batch_rows", [1, 4_000, plan.BATCH_ROWS])  # a rank a batch, two, all three
def test_every_analysis_by_rank_batches_is_the_whole_store_query(job_store, batch_rows, monkeypatch):
    monkeypatch.setattr(plan, "BATCH_ROWS", batch_rows)
    with store.open(job_store, by_ranks=False) as whole:
        expected = {name: _rows(whole.analysis(name)) for name in ANALYSES}
    with store.open(job_store) as job:
        got = {name: _rows(table) for name, table in job.analyses(*ANALYSES).items()}
        assert job.plan.done == set(ANALYSES)
    for name in ANALYSES:
        if "order by" in analysis_sql(name).rsplit(")", 1)[-1]:  # the view's own order is kept
            assert got[name] == expected[name], name
        else:
            assert sorted(got[name], key=repr) == sorted(expected[name], key=repr), name
    assert expected["steps"] and expected["operators"] and expected["blame"] is not None


def test_batches_hold_ranks_in_order_within_the_rows_asked():
    assert plan.batches([(0, 5), (1, 5), (2, 5), (3, 20), (4, 1)], limit=10) == [[0, 1], [2], [3], [4]]
    assert plan.batches([(0, 50)], limit=10) == [[0]]
    assert plan.batches([]) == []


def test_a_query_reads_the_analyses_it_names_not_its_own_expressions():
    assert plan.reads("with islands as (select * from activities) select * from islands join steps s on true") == {
        "activities", "steps"}


def test_an_error_in_a_batch_leaves_every_analysis_a_whole_store_view(job_store, monkeypatch):
    with store.open(job_store) as job:
        real = job.plan.view_sql

        def failing(name):
            if name == "operators":
                return "select * from no_such_table"
            return real(name)

        monkeypatch.setattr(job.plan, "view_sql", failing)
        with pytest.raises(Exception, match="no_such_table"):
            job.table("select * from operators")
        monkeypatch.setattr(job.plan, "view_sql", real)
        assert not {"steps", "operators"} & job.plan.done
        got = _rows(job.analysis("steps"))
    with store.open(job_store, by_ranks=False) as whole:
        assert got == _rows(whole.analysis("steps"))


def _odd_steps_trace() -> Trace:
    """Steps of very different lengths (the time buckets: their median, 147.5 us), two that overlap, gaps
    between them; a kernel running across four steps, a copy that ends in the bucket where two steps
    start, a host op across two steps' ends, rows before the first step and after the last."""
    b = ActivityBuilder()
    spans = [(1_000_000, 1_400_000), (1_500_000, 1_510_000), (1_505_000, 1_600_000), (2_000_000, 9_000_000),
             (9_000_000, 9_000_500), (9_100_000, 9_300_000)]
    for n, (lo, hi) in enumerate(spans):
        b.append(K.USER_ANNOTATION, "user_annotation", f"ProfilerStep#{n}", 0, 0, lo, hi)
    b.append(K.KERNEL, "kernel", "long", 1, 2, 1_200_000, 2_500_000)
    b.append(K.GPU_MEMCPY, "gpu_memcpy", "Memcpy HtoD", 1, 1, 8_900_000, 9_105_000)
    b.append(K.KERNEL, "kernel", "nccl:all_reduce", 1, 1, 9_200_000, 9_250_000)
    b.append(K.CPU_OP, "cpu_op", "aten::mm", 0, 0, 1_350_000, 1_520_000)
    b.append(K.CPU_OP, "cpu_op", "aten::add", 0, 0, 500_000, 600_000)
    b.append(K.CPU_OP, "cpu_op", "aten::add", 0, 0, 9_400_000, 9_500_000)
    b.append(K.CPU_OP, "cpu_op", "aten::add", 0, 0, 3_000_000, 3_200_000)
    devices = [Device("host", "cpu", 0, "host"), Device("cuda:0", "gpu", 0, "GPU 0", label="GPU 0")]
    resources = [Resource(0, 1, "main thread"), Resource(1, 7, "stream 7"), Resource(1, 8, "stream 8")]
    return Trace(activities=b.freeze(), devices=devices, resources=resources)


def test_steps_meet_every_row_that_overlaps_them_however_odd_the_steps(tmp_path):
    trace = _odd_steps_trace()
    write_trace(trace, str(tmp_path / "rank0.json"))
    store.write_store([tmp_path / "rank0.json"], tmp_path / "job.polyprof", jobs=1)
    expected = step_breakdown([trace], [0]).dicts()
    assert Store.of_traces([trace], [0]).analysis("steps").to_pylist() == expected
    with store.open(tmp_path / "job.polyprof") as job:
        assert job.analysis("steps").to_pylist() == expected
