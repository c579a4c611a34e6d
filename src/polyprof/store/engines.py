"""The engines a store's queries run on: DuckDB in this process (under a memory limit, spilling to a
folder of its own) and Apache Spark (in local mode, its heap sized from the store, or a cluster's).

::

    engine = engine_for("spark", activity_rows=7_200_000)   # local mode, a 2.9 GB heap
    engine.register_parquet("activities", folder, files)
    engine.arrow("select count(*) from activities")
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
import weakref
from typing import Any

import pyarrow as pa

from polyprof.errors import ConfigError
from polyprof.extras import require


def _duckdb_literal_glob(path: str) -> str:
    """`path` as a DuckDB glob that matches only itself (DuckDB reads every listed path as a pattern):
    each of ``*?[`` as a one-character class."""
    return re.sub(r"([*?\[])", r"[\1]", path)



#: DuckDB's memory by default: a store's analyses spill past it to a private temporary folder rather than
#: take most of the machine (DuckDB's own default: 80% of RAM). With the analyses a batch of ranks at a
#: time, a summary peaks at ~700 MB of RSS from 8 to 1,024 ranks (benchmarks/store_scale.py).
DEFAULT_MEMORY_LIMIT = "512MB"


class DuckDBEngine:
    """DuckDB in this process. ``memory_limit``: DuckDB's own setting ("2GB"; None: DuckDB's default, 80%
    of RAM); beyond it DuckDB spills to a temporary folder of this process's, removed at close."""

    name = "duckdb"

    def __init__(self, memory_limit: str | None = DEFAULT_MEMORY_LIMIT, threads: int | None = None) -> None:
        import tempfile

        import duckdb

        self.scratch = tempfile.mkdtemp(prefix="polyprof-duckdb-")
        self._remove_scratch = weakref.finalize(self, shutil.rmtree, self.scratch, True)  # at close, or at exit
        config = {k: v for k, v in (("memory_limit", memory_limit), ("threads", threads), ("temp_directory", self.scratch))
                  if v is not None}
        try:
            self.con = duckdb.connect(config=config)
        except duckdb.Error as exc:
            self._remove_scratch()
            raise ConfigError(f"DuckDB refused its settings ({exc}); a memory limit is written like 512MB or 2GB") from None
        self.con.execute("set enable_progress_bar = false")  # DuckDB draws its own bar on stdout, even piped

    def register_parquet(self, name: str, folder: str, files: list[str]) -> None:
        self.con.execute(f"create view {name} as {self.parquet_sql(files)}")

    @staticmethod
    def parquet_sql(files: list[str]) -> str:
        """The query that reads `files` (each a literal path, its rank from its ``rank=N`` folder)."""
        listed = ", ".join("'{}'".format(_duckdb_literal_glob(f).replace("'", "''")) for f in files)
        return f"select * from read_parquet([{listed}], hive_partitioning = true)"

    def register_view(self, name: str, query: str) -> None:
        self.con.execute(f"create view {name} as {query}")

    def register_arrow(self, name: str, table: pa.Table) -> None:
        self.con.register(name, table)

    def sql(self, query: str) -> Any:
        return self.con.sql(query)

    def arrow(self, query: str) -> pa.Table:
        relation = self.con.sql(query)
        return relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.arrow()

    def close(self) -> None:
        self.con.close()
        self._remove_scratch()


class SparkEngine:
    """Apache Spark: ``master`` a cluster's URL (``spark://host:7077``) or ``local[N]``. Queries are
    translated from DuckDB's dialect by sqlglot."""

    name = "spark"

    def __init__(self, master: str = "local[2]", session: Any = None, driver_memory: str | None = None) -> None:
        require("spark", "querying on Spark (with Java 17)")
        # pyspark's own notice about the pandas it finds: not the user's to act on (polyprof reads Arrow)
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
        from pyspark.sql import SparkSession

        if session is None:
            builder = (SparkSession.builder.master(master).appName("polyprof")
                       .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
                       .config("spark.ui.showConsoleProgress", "false").config("spark.log.level", "ERROR"))
            if driver_memory is not None:  # read when this process starts its JVM (not if one runs already)
                builder = builder.config("spark.driver.memory", driver_memory)
            session = builder.getOrCreate()
            session.sparkContext.setLogLevel("ERROR")  # its warnings are not the user's to act on
        self.spark = session

    @staticmethod
    def translate(query: str) -> str:
        """`query` in Spark's dialect. An exact quantile (DuckDB's ``quantile_cont``) becomes Spark's exact
        ``percentile`` (sqlglot would write ``percentile_cont``'s form, which Spark reads otherwise); a
        ``materialized`` common table expression, a plain one."""
        import sqlglot
        from sqlglot import exp

        def exact(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.PercentileCont) and node.expression is not None:
                return exp.Anonymous(this="percentile", expressions=[node.this, node.expression])
            if isinstance(node, exp.CTE):  # DuckDB's "as materialized" (a plan's hint): Spark plans its own
                node.set("materialized", None)
            return node

        return ";\n".join(e.transform(exact).sql("spark") for e in sqlglot.parse(query, read="duckdb") if e)

    def register_parquet(self, name: str, folder: str, files: list[str]) -> None:
        escaped = [re.sub(r"([*?\[\]{}\\])", r"\\\1", f) for f in files]  # Hadoop's globs: a character, literally
        self.spark.read.option("basePath", folder).parquet(*escaped).createOrReplaceTempView(name)

    def register_view(self, name: str, query: str) -> None:
        self.spark.sql(self.translate(query)).createOrReplaceTempView(name)

    def sql(self, query: str) -> Any:
        return self.spark.sql(self.translate(query))

    def arrow(self, query: str) -> pa.Table:
        frame = self.sql(query)
        return frame.toArrow() if hasattr(frame, "toArrow") else pa.Table.from_pandas(frame.toPandas())

    def close(self) -> None:
        pass  # the session is the process's; Spark stops it at exit


def local_spark_memory(activity_rows: int) -> str | None:
    """The heap of Spark's one JVM in local mode (driver and executor) for a store of `activity_rows`:
    2 GB and 128 MB per million rows, at most half this machine's memory (Spark's default, 1 GB, fails
    on an 8-rank store of 112 k rows a rank: building a broadcast join's table). None where the user
    sized it already (``--driver-memory`` in ``PYSPARK_SUBMIT_ARGS``): theirs stands."""
    submitted = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "driver-memory" in submitted or "spark.driver.memory" in submitted:
        return None
    wanted = 2048 + 128 * activity_rows // 1_000_000
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return f"{max(1024, min(wanted, machine // 2))}m"


def engine_for(spec: str | None, memory_limit: str | None = DEFAULT_MEMORY_LIMIT, activity_rows: int = 0) -> Any:
    """``None``/``"duckdb"``: DuckDB here (with `memory_limit`, see :class:`DuckDBEngine`); ``"spark"``
    (or ``local[N]``): Spark in local mode, its heap sized for `activity_rows` (:func:`local_spark_memory`);
    ``"spark://HOST:PORT"``: that Spark master (its executors sized by the cluster)."""
    if spec in (None, "", "duckdb"):
        return DuckDBEngine(memory_limit)
    if spec == "spark" or spec.startswith("local["):
        return SparkEngine("local[2]" if spec == "spark" else spec, driver_memory=local_spark_memory(activity_rows))
    if spec.startswith(("spark://", "yarn", "k8s://")):
        return SparkEngine(spec)
    raise ConfigError(f"unknown engine {spec!r}: use duckdb, spark (local mode) or spark://HOST:PORT")


