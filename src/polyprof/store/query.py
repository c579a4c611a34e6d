"""Query a store (:mod:`polyprof.store.schema`) with DuckDB, embedded, or Spark, on a cluster or in
local mode. The analyses are SQL written once, in DuckDB's dialect (``store/sql/*.sql``), and
translated for Spark by sqlglot (the translator ibis itself uses), so both engines run the same
expressions and a user can read, copy and change them.

::

    job = open("job.polyprof")                               # DuckDB
    job.sql("select rank, sum(dur_ns) from activities where kind = 'kernel' group by rank")
    job.analysis("blame")                                    # a pyarrow.Table
    spark = open("job.polyprof", engine="spark://head:7077") # or "spark" for local mode
"""

from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import weakref
from functools import cache
from importlib import resources
from typing import Any

import pyarrow as pa

from polyprof.errors import ConfigError
from polyprof.extras import require
from polyprof.store.schema import MANIFEST, SCHEMA_NAME, SCHEMA_VERSION, TABLES

#: the analyses, each a view of the store (later ones read earlier ones: clock, islands, launches)
ANALYSES = ("step_spans", "collective_ops", "clock", "islands", "launches", "blame", "kernels", "temporal", "idle", "overlap", "launch", "steps",
            "operators", "rank_steps", "rank_totals", "overview")  # fmt: skip


@cache
def analysis_sql(name: str) -> str:
    """The SQL text of analysis `name` (DuckDB's dialect)."""
    if name not in ANALYSES:
        raise ConfigError(f"no analysis {name!r}; there are: {', '.join(ANALYSES)}")
    from polyprof.analysis.ranks import COLLECTIVE

    text = resources.files("polyprof.store").joinpath("sql", f"{name}.sql").read_text()
    return text.replace("{COLLECTIVE}", "(?i)" + COLLECTIVE.pattern)


def read_manifest(path: str) -> dict[str, Any]:
    """The store's ``store.json``, checked: a folder that is not a store, or one of a newer schema, is
    a ConfigError saying so."""
    file = os.path.join(path, MANIFEST)
    try:
        with builtins.open(file) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path} is not a polyprof store (no {MANIFEST}); make one with: polyprof store TRACES -o {path}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} cannot be read: {exc}") from None
    if manifest.get("schema") != SCHEMA_NAME or not isinstance(manifest.get("version"), int):
        raise ConfigError(f"{file} is not a polyprof store's manifest")
    if manifest["version"] > SCHEMA_VERSION:
        raise ConfigError(f"{path} is a store of schema version {manifest['version']}; this polyprof reads up to "
                          f"{SCHEMA_VERSION}: upgrade polyprof")  # fmt: skip
    return manifest


def _duckdb_literal_glob(path: str) -> str:
    """`path` as a DuckDB glob that matches only itself (DuckDB reads every listed path as a pattern):
    each of ``*?[`` as a one-character class."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def rank_files(path: str, table: str, ranks: list[int]) -> list[str]:
    """The Parquet files of `table` of the ranks the manifest lists (a rank's folder planted beside them,
    or left by a rank killed before it was listed, is not read)."""
    files = [os.path.join(path, table, f"rank={int(rank)}", "part-0.parquet") for rank in ranks]
    return [f for f in files if os.path.isfile(f)]


class Store:
    """An open store: its tables and analyses (:data:`ANALYSES`) as views of one engine. A store
    on disk (:func:`open`) or the store of loaded traces, held in memory (:meth:`of_traces`)."""

    def __init__(self, path: str, engine: Any, manifest: dict[str, Any] | None = None) -> None:
        self.path = path
        self.engine = engine
        if manifest is None:
            self.manifest = read_manifest(path)
            for table in TABLES:  # the ranks the manifest lists, never what else a folder holds
                files = rank_files(path, table, self.ranks)
                if not files:
                    raise ConfigError(f"{os.path.join(path, table)}: the store has no {table} table")
                engine.register_parquet(table, os.path.join(path, table), files)
        else:
            self.manifest = manifest
        for view in ANALYSES:  # views: nothing runs until a query reads one
            engine.register_view(view, analysis_sql(view))

    @classmethod
    def of_traces(cls, traces: Any, ranks: Any = None) -> Store:
        """The store of `traces` (loaded Traces, one per rank; `ranks`: theirs, else each trace's own),
        in memory on DuckDB: the same tables and analyses as on disk, nothing written."""
        from polyprof.store.rank_tables import rank_tables

        engine = DuckDBEngine()
        per_rank = [rank_tables(t, fallback_rank=i) for i, t in enumerate(traces)]
        if ranks is not None:
            for tables, rank in zip(per_rank, ranks, strict=True):
                tables.rank = rank
        for name in TABLES:
            parts = [t.tables[name].append_column("rank", pa.array([t.rank] * t.tables[name].num_rows, pa.int64()))
                     for t in per_rank]  # fmt: skip
            engine.register_arrow(name, pa.concat_tables(parts) if parts else TABLES[name].empty_table())
        return cls("<memory>", engine, {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION,
                                        "ranks": sorted(t.rank for t in per_rank)})  # fmt: skip

    @property
    def ranks(self) -> list[int]:
        return list(self.manifest.get("ranks", []))

    def sql(self, query: str) -> Any:
        """`query` (DuckDB's dialect; translated for Spark) as the engine's relation: DuckDB's
        ``DuckDBPyRelation`` (``.df()``, ``.arrow()``, ``.pl()``) or Spark's DataFrame."""
        return self.engine.sql(query)

    def table(self, query: str) -> pa.Table:
        """`query`'s result as a pyarrow Table, whichever the engine."""
        return self.engine.arrow(query)

    def analysis(self, name: str) -> pa.Table:
        """Analysis `name` (see :data:`ANALYSES`) as a pyarrow Table."""
        return self.table(analysis_sql(name))

    def blame(self) -> pa.Table:
        return self.analysis("blame")

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: DuckDB's memory by default: a store's analyses spill past it to a private temporary folder rather than
#: take most of the machine (DuckDB's own default: 80% of RAM). 32 ranks of 112 k rows: a summary's peak
#: RSS 703 MB against 2.4 GB, its time 31 s against 24 s (benchmarks/store_summary_memory.py).
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
                  if v is not None}  # fmt: skip
        try:
            self.con = duckdb.connect(config=config)
        except duckdb.Error as exc:
            self._remove_scratch()
            raise ConfigError(f"DuckDB refused its settings ({exc}); a memory limit is written like 512MB or 2GB") from None
        self.con.execute("set enable_progress_bar = false")  # DuckDB draws its own bar on stdout, even piped

    def register_parquet(self, name: str, folder: str, files: list[str]) -> None:
        listed = ", ".join("'{}'".format(_duckdb_literal_glob(f).replace("'", "''")) for f in files)
        self.con.execute(f"create view {name} as select * from read_parquet([{listed}], hive_partitioning = true)")

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

    def __init__(self, master: str = "local[2]", session: Any = None) -> None:
        require("spark", "querying on Spark (with Java 17)")
        from pyspark.sql import SparkSession
        self.spark = session or (
            SparkSession.builder.master(master).appName("polyprof")
            .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
            .getOrCreate()
        )  # fmt: skip

    @staticmethod
    def translate(query: str) -> str:
        """`query` in Spark's dialect. An exact quantile (DuckDB's ``quantile_cont``) becomes Spark's exact
        ``percentile`` (sqlglot would write ``percentile_cont``'s form, which Spark reads otherwise)."""
        import sqlglot
        from sqlglot import exp

        def exact(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.PercentileCont) and node.expression is not None:
                return exp.Anonymous(this="percentile", expressions=[node.this, node.expression])
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


def engine_for(spec: str | None, memory_limit: str | None = DEFAULT_MEMORY_LIMIT) -> Any:
    """``None``/``"duckdb"``: DuckDB here (with `memory_limit`, see :class:`DuckDBEngine`); ``"spark"``:
    Spark in local mode; ``"spark://HOST:PORT"`` (or ``local[N]``): that Spark master."""
    if spec in (None, "", "duckdb"):
        return DuckDBEngine(memory_limit)
    if spec == "spark":
        return SparkEngine()
    if spec.startswith(("spark://", "local[", "yarn", "k8s://")):
        return SparkEngine(spec)
    raise ConfigError(f"unknown engine {spec!r}: use duckdb, spark (local mode) or spark://HOST:PORT")


def open(path: str | os.PathLike, engine: str | Any | None = None,  # noqa: A001 - the store's verb
         memory_limit: str | None = DEFAULT_MEMORY_LIMIT) -> Store:  # fmt: skip
    """Open the store at `path` on `engine` (see :func:`engine_for`, or an engine object); DuckDB's
    `memory_limit` ("2GB"; None: DuckDB's own default)."""
    chosen = engine if engine is not None and not isinstance(engine, str) else engine_for(engine, memory_limit)
    return Store(os.fspath(path), chosen)
