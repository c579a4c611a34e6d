"""Query a store (:mod:`polyprof.formats.store.schema`) with DuckDB, embedded, or Spark, on a cluster or in
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
from functools import cache
from importlib import resources
from typing import Any

import pyarrow as pa

from polyprof.errors import ConfigError
from polyprof.formats.store.schema import MANIFEST, SCHEMA_NAME, SCHEMA_VERSION, TABLES
from polyprof.store.engines import DEFAULT_MEMORY_LIMIT, DuckDBEngine, engine_for

#: the analyses, each a view of the store (later ones read earlier ones: clock, islands, launches)
ANALYSES = ("step_spans", "collective_ops", "clock", "islands", "launches", "outer_rows", "blame", "kernels", "temporal", "idle", "overlap", "launch", "steps",
            "operators", "rank_steps", "rank_totals", "overview")


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
                          f"{SCHEMA_VERSION}: upgrade polyprof")
    return manifest


def rank_files(path: str, table: str, ranks: list[int]) -> dict[int, str]:
    """Rank -> the Parquet file of `table`, for the ranks the manifest lists that have one (a rank's
    folder planted beside them, or left by a rank killed before it was listed, is not read)."""
    files = {rank: os.path.join(path, table, f"rank={int(rank)}", "part-0.parquet") for rank in ranks}
    return {rank: f for rank, f in files.items() if os.path.isfile(f)}


class Store:
    """An open store: its tables and analyses (:data:`ANALYSES`) as views of one engine. A store
    on disk (:func:`open`) or the store of loaded traces, held in memory (:meth:`of_traces`)."""

    def __init__(self, path: str, engine: Any, manifest: dict[str, Any] | None = None, by_ranks: bool = True) -> None:
        self.path = path
        self.engine = engine
        self.plan = None
        if manifest is None:
            self.manifest = read_manifest(path)
            listed = {table: rank_files(path, table, self.ranks) for table in TABLES}  # the ranks the manifest
            for table, files in listed.items():  # lists, never what else a folder holds
                if not files:
                    raise ConfigError(f"{os.path.join(path, table)}: the store has no {table} table")
                engine.register_parquet(table, os.path.join(path, table), list(files.values()))
            if by_ranks and isinstance(engine, DuckDBEngine):
                self.plan = self._rank_plan(listed["activities"])
        else:
            self.manifest = manifest
        for view in ANALYSES:  # views: nothing runs until a query reads one
            engine.register_view(view, analysis_sql(view))

    def _rank_plan(self, activity_files: dict[int, str]) -> Any:
        """The rank-local analyses run a batch of ranks at a time (:mod:`polyprof.store.plan`) over
        `activity_files` (rank -> its activities' file, as listed once at open)."""
        import pyarrow.parquet as pq

        from polyprof.store.plan import RankPlan

        rows = [(rank, pq.read_metadata(f).num_rows) for rank, f in activity_files.items()]
        return RankPlan(self.engine.con, lambda ranks: self.engine.parquet_sql([activity_files[r] for r in ranks]),
                        analysis_sql, ANALYSES, rows)

    @classmethod
    def of_traces(cls, traces: Any, ranks: Any = None) -> Store:
        """The store of `traces` (loaded Traces, one per rank; `ranks`: theirs, else each trace's own),
        in memory on DuckDB: the same tables and analyses as on disk, nothing written."""
        from polyprof.formats.store.rank_tables import rank_tables

        engine = DuckDBEngine()
        per_rank = [rank_tables(t, fallback_rank=i) for i, t in enumerate(traces)]
        if ranks is not None:
            for tables, rank in zip(per_rank, ranks, strict=True):
                tables.rank = rank
        for name in TABLES:
            parts = [t.tables[name].append_column("rank", pa.array([t.rank] * t.tables[name].num_rows, pa.int64()))
                     for t in per_rank]
            engine.register_arrow(name, pa.concat_tables(parts) if parts else TABLES[name].empty_table())
        return cls("<memory>", engine, {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION,
                                        "ranks": sorted(t.rank for t in per_rank)})

    @property
    def ranks(self) -> list[int]:
        return list(self.manifest.get("ranks", []))

    def sql(self, query: str) -> Any:
        """`query` (DuckDB's dialect; translated for Spark) as the engine's relation: DuckDB's
        ``DuckDBPyRelation`` (``.df()``, ``.arrow()``, ``.pl()``) or Spark's DataFrame."""
        self._prepare(query)
        return self.engine.sql(query)

    def table(self, query: str) -> pa.Table:
        """`query`'s result as a pyarrow Table, whichever the engine."""
        self._prepare(query)
        return self.engine.arrow(query)

    def _prepare(self, query: str) -> None:
        if self.plan is not None:
            self.plan.prepare(query)

    def analysis(self, name: str) -> pa.Table:
        """Analysis `name` (see :data:`ANALYSES`) as a pyarrow Table."""
        return self.table(analysis_sql(name))

    def analyses(self, *names: str) -> dict[str, pa.Table]:
        """Several analyses by name, each a pyarrow Table; on DuckDB what they share is computed once."""
        for name in names:
            analysis_sql(name)  # an unknown name: ConfigError before any work
        self._prepare(" ".join(f"from {name}" for name in names))
        return {name: self.analysis(name) for name in names}

    def blame(self) -> pa.Table:
        return self.analysis("blame")

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open(path: str | os.PathLike, engine: str | Any | None = None,  # noqa: A001 - the store's verb
         memory_limit: str | None = DEFAULT_MEMORY_LIMIT, by_ranks: bool = True) -> Store:
    """Open the store at `path` on `engine` (see :func:`engine_for`, or an engine object); DuckDB's
    `memory_limit` ("2GB"; None: DuckDB's own default). On DuckDB the per-rank analyses run a batch of
    ranks at a time (:mod:`polyprof.store.plan`); `by_ranks` False: as one query over the whole store."""
    path = os.fspath(path)
    if engine is None or isinstance(engine, str):
        engine = engine_for(engine, memory_limit, activity_rows=_activity_rows(read_manifest(path)))
    return Store(path, engine, by_ranks=by_ranks)


def _activity_rows(manifest: dict[str, Any]) -> int:
    """The store's activities as its manifest counts them (0 where it does not say: it is the writer's word,
    used only to size an engine)."""
    rows = manifest.get("rows")
    count = rows.get("activities") if isinstance(rows, dict) else None
    return count if isinstance(count, int) and 0 <= count < 1 << 48 else 0
