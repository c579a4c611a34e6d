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
             "where name not like 'ProfilerStep#%' group by rank, step, kind, name, level")  # fmt: skip
    with store.open(tmp_path / "job.polyprof") as duck:
        expected = duck.table(query)
    got = store.open(tmp_path / "job.polyprof", spark).table(query)
    key = ["rank", "step", "kind", "name", "level"]
    assert _rows(got, key) == _rows(expected, key) and got.num_rows > 3


@pytest.mark.parametrize("analysis", ["kernels", "temporal", "idle", "overlap", "launch", "steps", "operators",
                                      "rank_steps", "rank_totals", "overview"])  # fmt: skip
def test_spark_and_duckdb_give_the_same_device_analyses(tmp_path_factory, spark, analysis):
    from test_store import _write
    from test_store_analyses import random_trace

    from polyprof.store.rank_tables import rank_tables

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
