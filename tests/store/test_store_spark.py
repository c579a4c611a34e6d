"""The store's analyses on Apache Spark (local mode) give the tables DuckDB gives on the same store:
the same SQL, translated by sqlglot."""

import shutil

import pytest

pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")
pytest.importorskip("pyspark", reason="needs pyspark (the polyprof[spark] extra)")
pytest.importorskip("sqlglot", reason="needs sqlglot (the polyprof[spark] extra)")
if shutil.which("java") is None:
    pytest.skip("needs Java 17 for Spark (Debian's openjdk-17-jre-headless)", allow_module_level=True)

from test_store import _synthetic_job, stepped_trace  # noqa: E402,F401 - the fixture, shared

from polyprof import store  # noqa: E402
from polyprof.store.engines import SparkEngine  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    engine = SparkEngine("local[1]")
    yield engine
    engine.spark.stop()


def _rows(table, key):
    return sorted(table.to_pylist(), key=lambda r: tuple(str(r[k]) for k in key))


@pytest.mark.parametrize("analysis", ["clock", "blame"])
def test_spark_and_duckdb_give_the_same_analysis(tmp_path, spark, analysis):
    path = _synthetic_job(tmp_path)
    with store.open(path) as duck:
        expected = duck.analysis(analysis)
    got = store.open(path, spark).analysis(analysis)
    assert got.column_names == expected.column_names
    key = got.column_names
    assert _rows(got, key) == _rows(expected, key)
    assert got.num_rows > 0


def test_spark_reads_a_real_traces_store_as_duckdb_does(tmp_path, spark, stepped_trace):  # noqa: F811
    store.write_store([stepped_trace], tmp_path / "job.polyprof")
    query = ("select rank, step, kind, name, level, count(*) as n, sum(dur_ns) as ns from activities "
             "where name not like 'ProfilerStep#%' group by rank, step, kind, name, level")
    with store.open(tmp_path / "job.polyprof") as duck:
        expected = duck.table(query)
    got = store.open(tmp_path / "job.polyprof", spark).table(query)
    key = ["rank", "step", "kind", "name", "level"]
    assert _rows(got, key) == _rows(expected, key) and got.num_rows > 3


@pytest.mark.parametrize("analysis", ["kernels", "temporal", "idle", "overlap", "launch", "steps", "operators",
                                      "rank_steps", "rank_totals", "overview"])
def test_spark_and_duckdb_give_the_same_device_analyses(tmp_path_factory, spark, analysis):
    from test_store import _write
    from test_store_analyses import random_trace

    from polyprof.formats.store.rank_tables import rank_tables

    folder = tmp_path_factory.getbasetemp() / "device-job.polyprof"
    if not folder.exists():
        _write(folder, [rank_tables(random_trace(20261206 + r, r), fallback_rank=r) for r in range(2)])
    with store.open(folder) as duck:
        expected = duck.analysis(analysis)
    got = store.open(folder, spark).analysis(analysis)
    key = got.column_names
    rounded = [{k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()} for r in _rows(got, key)]
    wanted = [{k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()} for r in _rows(expected, key)]
    assert rounded == wanted and got.num_rows > 0


def test_local_mode_is_sized_from_the_store_and_a_users_setting_stands(monkeypatch):
    from polyprof.store.engines import local_spark_memory

    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    small, large = int(local_spark_memory(0)[:-1]), int(local_spark_memory(64 * 112_500)[:-1])
    assert small == 2048 and large == 2048 + 921  # 128 MB per million rows; Spark's default, 1 GB, fails on 8 ranks of 112 k rows
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 6g pyspark-shell")
    assert local_spark_memory(10**9) is None


def test_summary_on_spark_of_a_store_the_default_heap_cannot_hold(tmp_path):
    """8 synthetic ranks of ~112 k activities (benchmarks/job_traces.py): Spark's default heap (1 GB) runs
    out of memory on this store's overview (building a broadcast join's table); `polyprof summary
    --engine spark`, its heap sized from the store, prints what DuckDB's summary prints."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from job_traces import job_trace

    from polyprof.formats import write_trace

    (tmp_path / "traces").mkdir()
    for rank in range(8):
        write_trace(job_trace(rank, 8, 150_000), str(tmp_path / "traces" / f"rank{rank}.pftrace"))
    cli = [sys.executable, "-m", "polyprof"]
    made = subprocess.run([*cli, "store", "-q", "traces", "-o", "job.polyprof"], cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    on = {engine: subprocess.run([*cli, "summary", "-q", "job.polyprof", *args], cwd=tmp_path, capture_output=True,
                                 text=True, env={**env, "COLUMNS": "200"}, timeout=900)
          for engine, args in (("duckdb", []), ("spark", ["--engine", "spark"]))}
    assert on["spark"].returncode == 0, on["spark"].stderr[-3000:]
    assert "Exception" not in on["spark"].stderr and "Traceback" not in on["spark"].stderr, on["spark"].stderr[-2000:]
    assert on["spark"].stdout == on["duckdb"].stdout and "(8 ranks)" in on["duckdb"].stdout
