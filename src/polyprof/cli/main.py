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
import math
import os
import re
import runpy
import signal
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from polyprof._version import __version__
from polyprof.cli.progress import QUIET, shown
from polyprof.cli.render import EXIT_BAD_INPUT, fail, markup_safe, new_console, printable
from polyprof.cli.store import MEMORY
from polyprof.engine.signals import CleanStop, Signalled
from polyprof.errors import OutputPathError, PolyprofError, TraceFormatError
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
    from polyprof.engine.scheduled import Profile
    from polyprof.formats import check_output_path
    from polyprof.formats.spill.file import spill_path
    from polyprof.merge.limits import limits_from_cli

    if not os.path.isfile(script):
        fail(f"script {script} does not exist")
    _check_activity_settings()
    _behind_torch_profiler(torch_profiler)
    if on_demand:
        _run_on_demand(script, script_args)
    if flight_options and flight_seconds is None:
        fail("--flight-recorder-option needs --flight-recorder SECONDS")
    if flight_seconds is not None:
        _run_flight_recorder(flight_seconds, flight_dir, flight_options, script, script_args)
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        fail(f"--duration must be a positive, finite number of seconds, got {duration}")
    if ring is not None and not (math.isfinite(ring) and ring > 0):
        fail(f"--ring must be a positive, finite number of seconds, got {ring}")
    try:
        _make_output_folder(output)
        output = check_output_path(output)
        groups = [a for a in (activities.split(",") if activities else []) if a.strip()] or None
        spill_file = spill_path(output) if (ring is None if spill is None else spill) else None
        _hint_leftover_spill(spill_path(output), output)
        limits = limits_from_cli(min_span_us, include, exclude, exclude_kind, max_events)
        prof = Profile(groups, spill=spill_file, ring_s=ring, limits=limits)
    except PolyprofError as exc:
        fail(str(exc))

    script_path = os.path.abspath(script)
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(script_path))
    exit_code = 0
    lock = threading.Lock()
    done: dict[str, Any] = {}  # "written": the trace's path, once written; "error": why not
    console = new_console(stderr=True)

    def finish() -> None:
        """Stop and write the trace, once: when the window ends (--duration), or when the script does.
        Written at once, so that a process killed later keeps it."""
        with lock, stop.deferred():
            if done:
                return
            step_spans.remove()
            prof.stop()
            try:
                done["written"] = prof.export_chrome_trace(output)  # the spill goes once this is on disk
                click.echo(f"polyprof: trace written to {done['written']}", err=True)
            except PolyprofError as exc:
                done["error"] = str(exc)

    dumps: list[int] = []

    def dump_now(signum: int, frame: Any) -> None:
        """SIGUSR2: write what is recorded so far, and go on (for a job that hangs)."""
        base, ext = (output[: -len(".json.gz")], ".json.gz") if output.endswith(".json.gz") else os.path.splitext(output)
        dumps.append(signum)
        target = f"{base}.dump{len(dumps)}{ext or '.json'}"
        try:
            with lock:
                click.echo(f"polyprof: SIGUSR2: recording so far written to {prof.dump(target)}", err=True)
        except PolyprofError as exc:
            click.echo(f"polyprof: SIGUSR2: no dump ({exc})", err=True)

    def yield_to_the_scripts_profiler(other: Any) -> None:
        """The script's own profiler (polyprof's behind torch.profiler, or torch's own) starts recording:
        only one profile records ops at a time, so this run's trace ends here and is written now."""
        whose = "polyprof behind it" if hasattr(other, "step_num") else "torch's own"
        click.echo(f"polyprof: the script started its own profiler (torch.profiler, {whose}): this run's trace "
                   "ends here; the script's profiler writes its own traces", err=True)
        prof.add_metadata("polyprofRun", {"ended": "the script started its own profiler", "step": getattr(other, "step_num", None)})
        finish()

    prof.yield_to = yield_to_the_scripts_profiler
    previous_usr2 = signal.signal(signal.SIGUSR2, dump_now) if hasattr(signal, "SIGUSR2") else None
    alarm: list[Callable[[], None]] = []
    synced = None

    def begin() -> None:
        """Start the window (and its --duration alarm), and the step spans."""
        if synced is not None:
            prof.add_metadata("polyprofRun", {"started_after_optimizer_step": synced.agreed_step,
                                              "agreed_through": "the job's store", "problem": synced.problem})
        prof.start()
        step_spans.install()
        if duration is not None:
            alarm.append(_stop_after(duration, finish))

    from polyprof.torch.steps import OptimizerStepSpans

    step_spans = OptimizerStepSpans()  # ProfilerStep#N between the script's optimizer steps
    with CleanStop() as stop:
        from polyprof.torch.steps import SyncedStart, distributed_launch

        if duration is not None and distributed_launch():  # every rank's window starts at the same step
            synced = SyncedStart(on_start=begin)
            synced.install()
        else:
            begin()
        try:
            runpy.run_path(script_path, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            exit_code = code if isinstance(code, int) else (0 if code is None else 1)
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
        except Signalled as exc:
            click.echo(f"polyprof: {exc}: writing the trace, then exiting as the signal asks", err=True)
        except KeyboardInterrupt:
            stop.interrupted()
            click.echo("polyprof: interrupted: writing the trace, then exiting", err=True)
        except BaseException:  # the script's own failure: report it like python would, keep the trace
            traceback.print_exc()
            exit_code = 1
        finally:
            for cancel in alarm:
                cancel()
            if synced is not None:
                synced.remove()
                if not synced.started:
                    done["error"] = (
                        "--duration under torchrun starts right after an optimizer step every rank agrees on; "
                        "the script made none after init_process_group, so nothing was recorded "
                        "(run without --duration to profile the whole script)"
                    )
            try:
                finish()
            except Signalled:  # came while the trace was written: it is written; exit as it asks below
                pass
        if "error" in done:
            click.echo(f"polyprof: error: {done['error']}", err=True)
            if spill_file and os.path.exists(spill_file):
                click.echo(f"polyprof: what was recorded is kept: polyprof recover {spill_file} -o OTHER.json.gz", err=True)
            exit_code = exit_code or EXIT_BAD_INPUT
        elif summary and stop.signum is None:
            from polyprof.cli.render import print_summary

            try:
                with stop.deferred():
                    print_summary(prof.trace, console, top, f"polyprof summary: {os.path.basename(script)}")
            except Signalled:  # came while printing: the trace is written; exit as it asks
                pass
    if previous_usr2 is not None:
        signal.signal(signal.SIGUSR2, previous_usr2)
    stop.exit()
    sys.exit(exit_code)


def _check_activity_settings() -> None:
    """POLYPROF_ACTIVITIES or [tool.polyprof] activities naming a group nothing serves: said before the script."""
    from polyprof.profiler.settings import activity_edits

    try:
        activity_edits()
    except PolyprofError as exc:
        fail(str(exc))


def _behind_torch_profiler(wanted: bool | None) -> None:
    """torch.profiler is polyprof's in this process from torch's import on, and in what it starts:
    `wanted` (--torch-profiler/--no-torch-profiler), else POLYPROF_TORCH_PROFILER where it is set, else on."""
    from _polyprof_startup import BadSetting, flag
    from polyprof.profiler.behind_torch import ENV, install_when_torch_is_imported

    if wanted is None:
        try:
            wanted = flag(ENV) if os.environ.get(ENV, "").strip() else True
        except BadSetting as exc:
            fail(f"{exc}, or leave it unset for polyprof run's default (on)")
    os.environ[ENV] = "1" if wanted else "0"
    if wanted:
        install_when_torch_is_imported()


def _run_flight_recorder(seconds: float, folder: str, options: tuple[str, ...], script: str,
                         script_args: tuple[str, ...]) -> None:
    """`polyprof run --flight-recorder SECONDS`: the script runs as under python, the flight recorder on
    (and on in what it starts, through the environment, with the same settings)."""
    from polyprof.flight.environment import FOLDER, VARIABLE, settings_from, start_from_environment

    if not (math.isfinite(seconds) and seconds > 0):
        fail(f"--flight-recorder must be a positive, finite number of seconds, got {seconds}")
    try:
        settings_from(repr(seconds), options)  # (said before the script starts)
    except PolyprofError as exc:
        fail(str(exc))
    os.environ[VARIABLE] = ",".join((repr(seconds), *(o.strip() for o in options)))
    os.environ[FOLDER] = os.path.abspath(folder)
    try:
        recorder = start_from_environment()
    except PolyprofError as exc:
        fail(str(exc))
    click.echo(f"polyprof: flight recorder on: the last {seconds:g} s written to {recorder.out_dir} when "
               "something goes wrong (SIGUSR2: now)", err=True)
    _run_script(script, script_args)


def _run_on_demand(script: str, script_args: tuple[str, ...]) -> None:
    """`polyprof run --on-demand`: the script runs as under python, capturable, recording nothing."""
    from polyprof.ondemand import listen

    try:
        path = listen()
    except (PolyprofError, OSError) as exc:
        fail(f"cannot listen for captures: {exc}")
    click.echo(f"polyprof: pid {os.getpid()} is capturable (polyprof capture {os.getpid()} ...; socket {path})", err=True)
    _run_script(script, script_args)


def _run_script(script: str, script_args: tuple[str, ...]) -> None:
    """SCRIPT as `python SCRIPT ARGS...` runs it: its exit status, and its failure reported through
    sys.excepthook (where a flight recorder captures before the traceback is printed)."""
    script_path = os.path.abspath(script)
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(script_path))
    try:
        runpy.run_path(script_path, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        sys.excepthook(*sys.exc_info())
        sys.exit(1)
    sys.exit(0)


#: what _hint_leftover_spill renames a killed run's spill to (removed once recovered)
LEFT_SPILL = re.compile(r"\.spill(\.pftrace)?\.\d+\.left$")


def _removable(path: str, st: os.stat_result) -> bool:
    """Whether this process may remove `path` (whose lstat is `st`): its folder writable, and in a sticky
    folder (as /tmp) only its owner, the folder's or root."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        where = os.stat(folder)
    except OSError:
        return False
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    return not where.st_mode & stat.S_ISVTX or os.getuid() in (0, st.st_uid, where.st_uid)


def _hint_leftover_spill(spill_file: str, output: str) -> None:
    """A spill a killed run left where this run's goes: say how to recover it before it is replaced.
    Only a regular file of this user's is adopted: in a shared folder, what another user put there (or
    a link) is neither renamed nor offered for recovery."""
    try:
        st = os.lstat(spill_file)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        what = "a link" if stat.S_ISLNK(st.st_mode) else f"owner uid {st.st_uid}"
        done = ("replaced by this run's spill (a link's target is left alone), not offered for recovery"
                if _removable(spill_file, st) else "left alone: this run records without a spill")
        click.echo(f"polyprof: {spill_file} is not a file of yours ({what}): {done}", err=True)
        return
    keep = f"{spill_file}.{os.getpid()}.left"
    try:
        os.replace(spill_file, keep)
    except OSError:
        return
    base, ext = (output[: -len(".json.gz")], ".json.gz") if output.endswith(".json.gz") else os.path.splitext(output)
    click.echo(
        f"polyprof: a previous run writing {output} was killed before writing its trace; recover it with:\n"
        f"  polyprof recover {keep} -o {base}.recovered{ext or '.json'}",
        err=True,
    )


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


def _make_output_folder(output: str) -> None:
    """The folder of the user's own -o (``traces/rank{rank}.json.gz`` under torchrun), made as
    tensorboard_trace_handler makes its own."""
    from polyprof.formats.common.paths import expand_placeholders

    folder = os.path.dirname(os.path.abspath(expand_placeholders(output)))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot write the trace to {output}: cannot make its folder {folder} ({exc.strerror})") from None


def _stop_after(seconds: float, stop: Callable[[], None]) -> Callable[[], None]:
    """Call `stop` after `seconds`, on the main thread when possible (through SIGALRM), since some
    backends (torch's collector) must be stopped on the thread that started them. Returns a cancel
    function."""
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGALRM, lambda signum, frame: stop())
        signal.setitimer(signal.ITIMER_REAL, seconds)

        def cancel() -> None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

        return cancel
    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    return timer.cancel


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
