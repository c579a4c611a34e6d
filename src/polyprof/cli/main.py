"""``polyprof backends | run | summary | report | diff | recover | convert | merge | store | sql | ps | capture``.

::

    polyprof backends                              # what is installed, available, broken
    polyprof run -o trace.json script.py --lr 0.1  # profile a script, write the trace, print a summary
    polyprof summary trace.json.gz                 # top activities per kind and device
    polyprof summary --view kernels trace.json.gz  # one analysis (steps, kernels, ops, idle, ranks, backends...)
    polyprof report trace.json.gz -o report.html   # the self-contained HTML report
    polyprof diff before.json.gz after.json.gz     # what changed
    polyprof recover .trace.json.spill             # the trace of a run that was killed (SIGKILL, OOM)
    polyprof convert big.pt.trace.json big.pftrace # a trace too large to open, as Perfetto protobuf
    polyprof merge traces/ -o job.pftrace          # every rank's trace on one timeline
    polyprof store traces/ -o job.polyprof         # every rank into a columnar store (cli/store.py)
    polyprof sql job.polyprof "select ..."         # a query on it (DuckDB; --engine spark)
    polyprof ps                                    # running processes that can be captured on demand
    polyprof capture 4242 --steps 3                # capture one of them now (cli/ondemand.py)
"""

from __future__ import annotations

import contextlib
import os
import time

import click
from rich.table import Table

from polyprof._version import __version__
from polyprof.cli.progress import QUIET, shown
from polyprof.cli.render import fail, markup_safe, new_console, printable
from polyprof.cli.store import MEMORY
from polyprof.errors import PolyprofError, TraceFormatError
from polyprof.extras import MissingExtra, extra_for, install_hint


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="polyprof")
def cli() -> None:
    """polyprof: one timeline for host code and every accelerator, through run-time plugins."""


@cli.command()
def backends() -> None:
    """List installed backends: source, activity groups, and whether each can run here (and why not)."""
    from polyprof.engine.registry import default
    from polyprof.plugin.traits import backend_traits

    table = Table(title="polyprof backends", title_justify="left")
    for col in ("Name", "From", "Activities", "Status", "Traits", "Details"):
        table.add_column(col, overflow="fold")
    for entry in sorted(default.entries(), key=lambda e: e.name):
        acts = ", ".join(sorted(entry.activities)) or "?"
        row = [markup_safe(entry.name), markup_safe(entry.source), acts]
        traits = markup_safe(", ".join(backend_traits(entry.backend).described())) if entry.backend is not None else ""
        if entry.conflict:
            table.add_row(*row, "[red]conflict[/red]", traits, markup_safe(entry.conflict))
        elif entry.error:
            table.add_row(*row, "[red]broken[/red]", traits, markup_safe(entry.error))
        else:
            avail = default.probe(entry)
            if avail.available:
                details = ", ".join(avail.devices)
                versions = ", ".join(f"{k} {v}" for k, v in avail.versions.items())
                table.add_row(*row, "[green]available[/green]", traits, markup_safe("; ".join(filter(None, [details, versions]))))
            else:
                table.add_row(*row, "[yellow]unavailable[/yellow]", traits, markup_safe(avail.reason))
    new_console(piped_width=160).print(table)  # (six columns: a device's reason stays on one line)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "-o",
    "--output",
    default="polyprof_trace.json",
    show_default=True,
    help="Trace file to write (.json or .json.gz).",
)
@click.option(
    "--activities",
    default=None,
    help="Comma-separated activity groups (e.g. cpu,opencl); default: all available.",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Stop profiling after this many seconds (the script runs on). Under torchrun the window starts "
    "right after the same optimizer step on every rank (agreed through the job's store).",
)
@click.option(
    "--summary/--no-summary", default=True, show_default=True, help="Print the top activities when done."
)
@click.option(
    "--top", type=int, default=10, show_default=True, help="Rows per kind and device in the summary."
)
@click.option(
    "--spill/--no-spill",
    default=None,
    help="While recording, append what is complete to a hidden file beside the output every second, so "
    "that a killed run can be recovered (polyprof recover). Default: on, off with --ring (a spill keeps "
    "everything, the ring only the last seconds).",
)
@click.option(
    "--ring",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Keep only the last SECONDS of activity (host and devices that hand rows over while recording); "
    "written when the script ends, fails or is stopped by a signal, and on SIGUSR2.",
)
@click.option("--min-span-us", type=float, default=None, help="Drop host spans shorter than this (µs); counted.")
@click.option("--include", multiple=True, metavar="PATTERN", help="Keep only activities whose name matches (glob; repeatable).")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Drop activities whose name matches (glob; repeatable).")
@click.option("--exclude-kind", multiple=True, metavar="KIND", help="Drop activities of this kind, e.g. cpu_op, kernel (repeatable).")
@click.option("--max-events", type=int, default=None, help="Keep each backend's earliest N activities; the rest are counted.")
@click.option("--on-demand", is_flag=True, help="Record nothing now: run SCRIPT capturable on demand "
              "(polyprof ps, polyprof capture PID), as POLYPROF_ON_DEMAND=1 does.")
@click.option("--flight-recorder", "flight_seconds", type=float, default=None, metavar="SECONDS",
              help="Record nothing to a trace now: keep the last SECONDS always (steps, annotations, top-level "
              "ops, collectives) and write them to --flight-dir when a step is slow, the script hangs, fails "
              "or is signalled (POLYPROF_FLIGHT_RECORDER=SECONDS, which torchrun's ranks inherit).")
@click.option("--flight-dir", default="flight", show_default=True, help="Where --flight-recorder writes.")
@click.option("--flight-recorder-option", "flight_options", multiple=True, metavar="NAME=VALUE",
              help="One of the flight recorder's settings, e.g. hang_s=120, slow_step=off, max_captures=10 "
              "(repeatable; the table in docs/flight-recorder.md).")
@click.option("--torch-profiler/--no-torch-profiler", default=None,
              help="Put polyprof behind torch.profiler in SCRIPT and what it starts (the default, unless "
              "POLYPROF_TORCH_PROFILER=0 is set): "
              "profilers that SCRIPT or its framework make are polyprof's; when one starts recording, this "
              "run's own trace ends there and is written. --no-torch-profiler leaves torch.profiler torch's "
              "own, which cannot start while this run records the script's ops (one profiler at a time).")
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run(
    output: str,
    activities: str | None,
    duration: float | None,
    summary: bool,
    top: int,
    spill: bool | None,
    ring: float | None,
    min_span_us: float | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    exclude_kind: tuple[str, ...],
    max_events: int | None,
    on_demand: bool,
    flight_seconds: float | None,
    flight_dir: str,
    flight_options: tuple[str, ...],
    torch_profiler: bool | None,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Run SCRIPT like `python SCRIPT ARGS...` under the profiler and write its trace."""
    from polyprof.cli.script_run import RunSettings, run_script

    run_script(RunSettings(output, activities, duration, summary, top, spill, ring, min_span_us, include, exclude,
                           exclude_kind, max_events, on_demand, flight_seconds, flight_dir, flight_options,
                           torch_profiler), script, script_args)


@cli.command()
@click.argument("spill_file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", default=None, help="Trace file to write (default: beside the spill, .recovered.json.gz).")
@QUIET
def recover(spill_file: str, output: str | None, quiet: bool) -> None:
    """Write a trace from SPILL_FILE, what a killed `polyprof run` (or a profile with spill=) left."""
    from polyprof.formats import write_trace
    from polyprof.formats.spill.recover import recover_trace

    try:
        with shown(quiet):
            trace = recover_trace(spill_file)
        if output is None:
            folder, name = os.path.split(os.path.abspath(spill_file))
            stem = name.lstrip(".").split(".spill")[0]
            stem = stem[: -len(".json.gz")] if stem.endswith(".json.gz") else os.path.splitext(stem)[0]
            output = os.path.join(folder, f"{stem}.recovered.json.gz")
        written = write_trace(trace, output)
    except (PolyprofError, TraceFormatError) as exc:
        fail(str(exc))
    from polyprof.cli.script_run import LEFT_SPILL

    if LEFT_SPILL.search(os.path.basename(spill_file)):  # polyprof run's copy of a killed run's spill: done with
        with contextlib.suppress(OSError):
            os.unlink(spill_file)
    partial = trace.metadata["polyprof"]["partial"]
    click.echo(
        f"polyprof: recovered {len(trace.activities)} activities from {partial['chunks']} chunks "
        f"(ended {partial['ended'].split(':')[0]}; backends: {printable(', '.join(partial['backends_flushed'])) or 'none'}) "
        f"into {written}",
        err=True,
    )
    for what in partial.get("dropped", []):
        click.echo(f"polyprof: left out (its checksum matched, but it cannot be used): {printable(what)}", err=True)


VIEWS = ("top", "steps", "kernels", "ops", "idle", "ranks", "backends", "launch", "devices")


@cli.command()
@click.argument("trace_files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--top", type=int, default=10, show_default=True, help="Rows per kind and device.")
@click.option("--view", type=click.Choice(VIEWS), default=None,
              help="One analysis, with the numbers the report shows: steps (breakdown), kernels, ops, idle, ranks, "
              "backends, launch (latency), devices (temporal breakdown and kinds of work); default: the top activities, "
              "or the rank view for several traces.")
@click.option("--engine", default=None, help="For a store: duckdb (default), spark (local mode) or spark://HOST:PORT.")
@MEMORY
@QUIET
def summary(trace_files: tuple[str, ...], top: int, view: str | None, engine: str | None, memory_limit: str | None,
            quiet: bool) -> None:
    """Top activities by total time per kind and device, from a trace file (.json, .pftrace, either .gz);
    with several ranks' traces (or a folder of them): step times per rank, the slowest rank of each step,
    time in collectives and who waited; for a store (polyprof store): its clocks and who made everyone
    wait, by rank and step."""
    from polyprof.cli.render import print_rank_view, print_summary
    from polyprof.cli.store import is_store, print_store_summary, print_store_view
    from polyprof.formats import load_trace

    if len(trace_files) == 1 and is_store(trace_files[0]):
        with shown(quiet):  # a bar over the ranks as their analyses run
            if view in (None, "top"):
                print_store_summary(trace_files[0], engine, memory_limit)
            else:
                print_store_view(trace_files[0], engine, view, max(top, 30), memory_limit)
        return
    if engine is not None:
        fail("--engine reads a store (polyprof store TRACES -o job.polyprof); give the store's folder")

    several = len(trace_files) > 1 or os.path.isdir(trace_files[0])
    if view not in (None, "top") and not (view == "ranks" and several):
        _print_view(trace_files, view, max(top, 30))
        return
    if several:
        from polyprof.analysis.ranks import load_ranks, rank_view
        from polyprof.cli.store import print_blame

        try:
            with shown(quiet):
                traces, _, numbers = load_ranks(trace_files)
            ranks = rank_view(traces)
        except (TraceFormatError, PolyprofError) as exc:
            fail(str(exc))
        console = new_console()
        print_rank_view(ranks, console)
        from polyprof.extras import install_hint, missing

        if missing("store"):
            console.print(f"who made everyone wait needs the 'store' extra (pyarrow, duckdb): {install_hint('store')}",
                          markup=False)
        else:
            from polyprof.store.query import Store

            print_blame(Store.of_traces(traces, numbers).blame().to_pylist(), console)
        return
    try:
        trace = load_trace(trace_files[0])
    except TraceFormatError as exc:
        fail(str(exc))
    print_summary(trace, new_console(), top, f"polyprof summary: {trace_files[0]}")


def _print_view(trace_files: tuple[str, ...], view: str, limit: int) -> None:
    from polyprof.analysis.overview import overview
    from polyprof.analysis.ranks import load_ranks
    from polyprof.cli.render import analysis_table, print_rank_view

    try:
        traces, _, ranks = load_ranks(trace_files)
        ov = overview(traces, ranks, top=limit)
    except (TraceFormatError, PolyprofError) as exc:
        fail(str(exc))
    console = new_console()
    if view == "ranks":
        console.print("one trace: no ranks to compare (give several ranks' traces, or a folder of them)")
        return
    tables = {"steps": [ov.steps], "kernels": [ov.kernels], "ops": [ov.operators], "idle": [ov.idle],
              "backends": [ov.backends], "launch": [ov.launch], "devices": [ov.temporal, ov.kernel_types, ov.overlap]}[view]
    for table in tables:
        if table.rows:
            console.print(analysis_table(table, limit=limit))
        else:
            console.print(f"{table.title}: nothing in this trace")
    if ov.findings and view in ("steps", "devices", "idle"):
        console.print("\n".join(f"- {f}" for f in ov.findings), highlight=False)
    if ov.rank_view is not None and view == "steps":
        print_rank_view(ov.rank_view, console)


@cli.command()
@click.argument("trace_files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("-o", "--output", default="polyprof-report.html", show_default=True, help="The HTML file to write.")
@click.option("--baseline", default=None, type=click.Path(dir_okay=False), help="A trace to compare with (a diff section).")
@QUIET
def report(trace_files: tuple[str, ...], output: str, baseline: str | None, quiet: bool) -> None:
    """One self-contained HTML report (opens offline) of TRACE_FILES: one trace, or several ranks' (or a
    folder): what to look at, steps, devices, kernels, operators, launch latency, idle time, ranks,
    counters, backends."""
    from polyprof.report import write_report

    started = time.perf_counter()
    try:
        with shown(quiet):
            written = write_report(list(trace_files), output, baseline=baseline)
    except (TraceFormatError, PolyprofError) as exc:
        fail(str(exc))
    size = os.path.getsize(written)
    click.echo(f"polyprof: report written to {written} ({size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s)", err=True)
    click.echo(written)


@cli.command(name="diff")
@click.argument("before", type=click.Path())
@click.argument("after", type=click.Path())
@click.option("--top", type=int, default=15, show_default=True, help="Rows per table.")
@click.option("-o", "--output", default=None, help="Also write AFTER's report with a diff section against BEFORE.")
def diff_command(before: str, after: str, top: int, output: str | None) -> None:
    """Compare two traces, or two stores of jobs (before and after a change): step time, and the ops
    and kernels whose time changed most, new and vanished ones."""
    from polyprof.analysis.diff import diff
    from polyprof.cli.render import analysis_table, format_ns
    from polyprof.formats import load_trace

    stores = os.path.isdir(before), os.path.isdir(after)
    if any(stores) and not all(stores):
        fail(f"diff compares two traces or two stores; {before if stores[0] else after} is a store and the other not")
    if all(stores) and output:
        fail("-o writes a trace's report; for two stores, leave it out")
    try:
        if all(stores):
            from polyprof import store

            with store.open(before) as b, store.open(after) as a:
                d = store.diff(b, a, top=top)
        else:
            d = diff(load_trace(before), load_trace(after), top=top)
    except (TraceFormatError, PolyprofError) as exc:
        fail(str(exc))
    console = new_console()
    if d.step_ns:
        b, a = d.step_ns
        console.print(f"mean step: {format_ns(b)} before, {format_ns(a)} after ({(a - b) / (b or 1):+.1%})", highlight=False)
    else:
        console.print("no ProfilerStep# spans on both sides: times compared in total", highlight=False)
    for table in (d.operators, d.kernels):
        console.print(analysis_table(table, limit=top) if table.rows else f"{table.title}: none")
    if output:
        from polyprof.report import write_report

        try:
            written = write_report([after], output, baseline=before)
        except (TraceFormatError, PolyprofError) as exc:
            fail(str(exc))
        click.echo(f"polyprof: report with the diff written to {written}", err=True)


@cli.command()
@click.argument("input_file", type=click.Path(dir_okay=False))
@click.argument("output_file", type=click.Path(dir_okay=False))
@click.option("--format", "out_format", type=click.Choice(["json", "perfetto"]), default=None,
              help="Output format (default: from OUTPUT_FILE's suffix: .pftrace/.perfetto-trace is Perfetto).")
@QUIET
def convert(input_file: str, output_file: str, out_format: str | None, quiet: bool) -> None:
    """Convert a trace: Kineto/torch.profiler or polyprof JSON to Perfetto protobuf (streaming: a trace
    too large to open converts without loading it), or a .pftrace back to JSON."""
    from polyprof.tools.convert import convert as run_convert

    started = time.perf_counter()
    try:
        with shown(quiet):
            stats = run_convert(input_file, output_file, format=out_format)
    except (TraceFormatError, PolyprofError) as exc:
        fail(str(exc))
    seconds = time.perf_counter() - started
    skipped = "".join(f"; left out: {n:,} {why}" for why, n in stats.skipped.items())
    click.echo(
        f"polyprof: {stats.events:,} activities, {stats.flows:,} flow ends, {stats.counters:,} counter samples "
        f"written to {stats.output} in {seconds:.1f} s ({stats.input_bytes / max(seconds, 1e-9) / 1e6:.1f} MB/s){skipped}",
        err=True,
    )


@cli.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("-o", "--output", required=True, help="Merged trace to write (.json[.gz] or .pftrace[.gz]).")
@QUIET
def merge(traces: tuple[str, ...], output: str, quiet: bool) -> None:
    """One timeline from many ranks' TRACES (files or folders; polyprof's or torch.profiler's): a
    process per rank and device, ids kept unique, clocks put on rank 0's where the traces recorded it."""
    from polyprof.tools.merge_ranks import merge_traces

    started = time.perf_counter()
    try:
        with shown(quiet):
            stats = merge_traces(list(traces), output)
    except (TraceFormatError, PolyprofError) as exc:
        fail(str(exc))
    aligned = sum(r.offset_ns is not None for r in stats.ranks)
    click.echo(
        f"polyprof: {len(stats.ranks)} ranks, {stats.events:,} activities merged into {stats.output} in "
        f"{time.perf_counter() - started:.1f} s ({aligned} of {len(stats.ranks)} with a recorded clock offset to rank 0)",
        err=True,
    )


def _add_commands() -> None:
    from polyprof.cli.ondemand import capture, ps
    from polyprof.cli.store import sql_command, store_command

    for command in (ps, capture, store_command, sql_command):
        cli.add_command(command)


_add_commands()


def main() -> None:
    try:
        cli(prog_name="polyprof")
    except MissingExtra as exc:
        fail(str(exc))
    except ImportError as exc:  # an optional library a command reached for: the extra that brings it
        extra = extra_for(exc)
        if extra is None:
            raise
        fail(f"this command needs the '{extra}' extra ({exc.name} is not installed): {install_hint(extra)}")


if __name__ == "__main__":
    main()
