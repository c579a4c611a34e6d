"""``polyprof store`` and ``polyprof sql``: a job's traces into the columnar store, and queries on it
(see :mod:`polyprof.store`); ``polyprof summary STORE`` reads a store too (:func:`print_store_summary`).

::

    polyprof store traces/ -o job.polyprof                     # every rank, several at once
    polyprof sql job.polyprof "select rank, count(*) from activities group by rank"
    polyprof sql job.polyprof --engine spark "select * from blame limit 5"
    polyprof summary job.polyprof                              # who made everyone wait, per step and rank
"""

from __future__ import annotations

import os
import time
from typing import Any

import click
from rich.table import Table

from polyprof.cli.progress import QUIET, shown
from polyprof.cli.render import fail, format_ns, markup_safe, new_console
from polyprof.errors import PolyprofError, TraceFormatError

ENGINE_HELP = "duckdb (default, in this process), spark (local mode) or spark://HOST:PORT."
#: `--memory-limit` of the commands that query a store
MEMORY = click.option("--memory-limit", default=None, help="For a store on DuckDB: its memory, e.g. 2GB (default: "
                      "polyprof's, docs/store.md; 'none': DuckDB's own, 80% of RAM); past it, it spills to a temporary folder.")


def memory_option(text: str | None) -> dict[str, Any]:
    """The store's open() keywords for `--memory-limit TEXT` (none given: polyprof's default)."""
    if text is None:
        return {}
    return {"memory_limit": None if text.strip().lower() in ("none", "") else text.strip()}


def engine_failure(what: str, exc: BaseException) -> str:
    """One line for an engine's own error (DuckDB's, or Spark's Java stack): what failed, and for Spark
    out of memory, how to give it more."""
    text = str(exc)
    if "OutOfMemoryError" in text or "Not enough memory" in text:
        return (f"{what} failed: Spark ran out of memory; give its JVM more before it starts, e.g. "
                "PYSPARK_SUBMIT_ARGS='--driver-memory 8g pyspark-shell' (local mode), or size the cluster's executors")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next((line for line in lines if line.startswith(("Caused by:", "org.apache.spark."))), lines[0] if lines else "")
    return f"{what} failed: {cause or type(exc).__name__}"


def is_store(path: str) -> bool:
    from polyprof.formats.common.paths import MANIFEST

    return os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST))


@click.command("store")
@click.argument("traces", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("-o", "--output", required=True, help="The store (a folder) to write, e.g. job.polyprof.")
@click.option("-j", "--jobs", type=int, default=None, help="Ranks converted at once (default: the CPUs).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@QUIET
def store_command(traces: tuple[str, ...], output: str, jobs: int | None, overwrite: bool, quiet: bool) -> None:
    """Write TRACES (files or folders; one per rank; polyprof's or torch.profiler's JSON or .pftrace) into
    a columnar store that DuckDB or Spark query: Parquet tables partitioned by rank (docs: store.md)."""
    from polyprof.formats.common.job import trace_files
    from polyprof.store import write_store

    if jobs is not None and jobs < 1:
        fail(f"--jobs must be at least 1, got {jobs}")
    started = time.perf_counter()
    try:
        with shown(quiet):
            stats = write_store(trace_files(list(traces)), output, jobs=jobs, overwrite=overwrite)
    except (TraceFormatError, PolyprofError) as exc:
        fail(str(exc))
    rows = ", ".join(f"{n:,} {table}" for table, n in stats.rows.items() if n and table != "ranks")
    ranks = f"{len(stats.ranks)} rank{'' if len(stats.ranks) == 1 else 's'}"
    click.echo(f"polyprof: {ranks} into {stats.path} in {time.perf_counter() - started:.1f} s (rows: {rows})", err=True)


@click.command("sql")
@click.argument("store", type=click.Path(file_okay=False))
@click.argument("query")
@click.option("--engine", default="duckdb", show_default=True, help=ENGINE_HELP)
@click.option("--format", "out_format", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--limit", type=int, default=100, show_default=True, help="Rows shown in the table format.")
@MEMORY
@QUIET
def sql_command(store: str, query: str, engine: str, out_format: str, limit: int, memory_limit: str | None,
                quiet: bool) -> None:
    """Run QUERY (DuckDB's SQL; translated for Spark) on STORE (see the views below)."""
    from polyprof import store as polystore

    try:
        with polystore.open(store, engine, **memory_option(memory_limit)) as job, shown(quiet):
            result = job.table(query)
    except PolyprofError as exc:
        fail(str(exc))
    except Exception as exc:  # the engine's own error (a typo in the query): one line
        fail(engine_failure("the query", exc))
    if out_format == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(_csv_ready(result), click.get_binary_stream("stdout"))
        return
    if out_format == "json":
        import orjson

        for row in result.to_pylist():
            click.echo(orjson.dumps(row, default=str))
        return
    print_rows(new_console(), result, limit, more="--limit, or --format csv")


def print_rows(console: Any, table: Any, limit: int, more: str, title: str | None = None) -> None:
    """The first `limit` rows of the Arrow `table`; how many more there are, and `more` (how to see them)."""
    shown = Table(*table.column_names, title=title)
    for row in table.slice(0, limit).to_pylist():
        shown.add_row(*(markup_safe("" if v is None else v) for v in row.values()))
    console.print(shown)
    if table.num_rows > limit:
        console.print(f"({table.num_rows - limit:,} more rows: {more})")


def _views() -> str:
    """The store's analyses, one view each (store/sql/*.sql), named without importing the store extra."""
    import polyprof

    folder = os.path.join(os.path.dirname(polyprof.__file__), "store", "sql")
    return ", ".join(sorted(name[:-4] for name in os.listdir(folder) if name.endswith(".sql")))


sql_command.help = (f"Run QUERY (DuckDB's SQL; translated for Spark) on STORE. Tables: activities, collectives, "
                    f"counters, backends, ranks; the analyses are views: {_views()} (docs: store.md).")


def _csv_ready(table: Any) -> Any:
    """`table` with its nested columns (lists, structs, maps), which CSV cannot hold, as JSON text."""
    import orjson
    import pyarrow as pa

    for i, field in enumerate(table.schema):
        if pa.types.is_nested(field.type):
            text = [None if v is None else orjson.dumps(v, default=str).decode() for v in table.column(i).to_pylist()]
            table = table.set_column(i, field.name, pa.array(text, pa.string()))
    return table


#: `polyprof summary STORE --view V`: the store's analyses that answer it
STORE_VIEWS = {"steps": ("steps",), "kernels": ("kernels",), "ops": ("operators",), "idle": ("idle",),
               "launch": ("launch",), "devices": ("temporal", "overlap"), "ranks": ("overview",)}


def print_store_view(path: str, engine: str | None, view: str, limit: int, memory: str | None = None) -> None:
    """One analysis of a store, as the view of a trace shows it (the store's own tables of it)."""
    from polyprof import store as polystore

    names = STORE_VIEWS.get(view)
    if names is None:
        fail(f"--view {view} reads trace files; for a store, ask it: polyprof sql {path} \"select * from {view}\"")
    try:
        with polystore.open(path, engine, **memory_option(memory)) as job:
            tables = list(job.analyses(*names).items())
    except PolyprofError as exc:
        fail(str(exc))
    except Exception as exc:  # the engine's own
        fail(engine_failure(f"the {view} view", exc))
    console = new_console()
    for name, table in tables:
        print_rows(console, table, limit, more=f'polyprof sql {path} "select * from {name}"',
                   title=f"{name} ({table.num_rows:,} rows)")


def print_store_summary(path: str, engine: str | None, memory: str | None = None) -> None:
    """The job's ranks and clocks, and who made everyone wait, by rank and by step."""
    from polyprof import store as polystore

    try:
        with polystore.open(path, engine, **memory_option(memory)) as job:
            found = {name: table.to_pylist() for name, table in job.analyses("clock", "blame", "overview").items()}
            clock, blame, overview = found["clock"], found["blame"], found["overview"]
    except PolyprofError as exc:
        fail(str(exc))
    except Exception as exc:  # the engine's own
        fail(engine_failure("the summary", exc))
    console = new_console()
    console.print(f"polyprof summary: {path} ({len(clock)} ranks)")
    print_overview(overview, console)
    ct = Table("rank", "recorded offset", "± recorded", "fitted correction", "± fitted", "applied", title="clocks")
    for r in clock:
        ct.add_row(str(r["rank"]), format_ns(r["recorded_offset_ns"] or 0),
                   format_ns(r["recorded_uncertainty_ns"]) if r["recorded_uncertainty_ns"] is not None else "-",
                   format_ns(r["fitted_correction_ns"] or 0),
                   format_ns(r["fitted_uncertainty_ns"]) if r["fitted_uncertainty_ns"] is not None else "-",
                   format_ns(r["applied_correction_ns"]))
    console.print(ct)
    print_blame(blame, console)


def print_overview(rows: list[dict], console: Any, top: int = 16) -> None:
    """The overview analysis's rows: the ranks with the longest mean step first."""
    share = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    shown = sorted(rows, key=lambda r: -(r["mean_step_ns"] or 0))[:top]
    title = "ranks" if len(shown) == len(rows) else f"the {len(shown)} ranks of {len(rows)} with the longest steps"
    t = Table("rank", "steps", "mean step", "compute", "comm.", "memory", "host only", "idle", "top kernel",
              "top op (self)", "waited", "made others wait", title=title)
    for r in shown:
        t.add_row(str(r["rank"]), str(r["steps"]), format_ns(r["mean_step_ns"] or 0), share(r["compute_share"]),
                  share(r["communication_share"]), share(r["memory_share"]), share(r["host_only_share"]),
                  share(r["idle_share"]), markup_safe(r["top_kernel"] or "-"), markup_safe(r["top_op"] or "-"),
                  format_ns(r["waited_ns"]), format_ns(r["made_others_wait_ns"]))
    console.print(t)


def print_blame(rows: list[dict], console: Any, top: int = 12) -> None:
    """Who made everyone wait (the blame analysis's rows): the wait each rank cost the others, and the
    largest waits by step with what the late rank was doing."""
    if not rows:
        console.print("who made everyone wait: no collective that every rank entered (none recorded, or one rank only)")
        return
    setup = [r for r in rows if r["setup"]]
    rows = [r for r in rows if not r["setup"]]
    if setup:
        late: dict[int, int] = {}
        for r in setup:
            late[r["late_rank"]] = late.get(r["late_rank"], 0) + r["cause_ns"]
        rank, ns = max(late.items(), key=lambda kv: kv[1])
        console.print(f"set-up, before the first step (DDP's construction, the first all-gathers): others waited "
                      f"{format_ns(sum(late.values()))} in all, {format_ns(ns)} of it for rank {rank}; not counted below",
                      highlight=False)
        if not rows:
            return
    by_rank: dict[int, list] = {}
    by_cause: dict[tuple, int] = {}
    for r in rows:
        entry = by_rank.setdefault(r["late_rank"], [0, set()])
        entry[0] += r["cause_ns"]
        entry[1].add((r["process_group"], r["seq"]))
        key = (r["step"], r["late_rank"], r["cause"], r["cause_kind"])
        by_cause[key] = by_cause.get(key, 0) + r["cause_ns"]
    rt = Table("rank", "made others wait", "collectives it was last into", title="who made everyone wait")
    for rank, (ns, instances) in sorted(by_rank.items(), key=lambda kv: -kv[1][0]):
        rt.add_row(str(rank), format_ns(ns), str(len(instances)))
    console.print(rt)
    wt = Table("step", "late rank", "doing", "kind", "others waited", title="the largest waits and what the late rank was doing")
    for (step, rank, cause, kind), ns in sorted(by_cause.items(), key=lambda kv: -kv[1])[:top]:
        wt.add_row(str(step), str(rank), markup_safe(cause), kind, format_ns(ns))
    console.print(wt)
