"""``polyprof run``: SCRIPT runs as ``python SCRIPT ARGS...`` runs it, under the profiler, and its trace is
written once, whatever ends the recording (the script's end, ``--duration``, a signal, the script's own
torch.profiler starting); SIGUSR2 writes what is recorded so far. Or it runs capturable on demand
(``--on-demand``) or under the flight recorder (``--flight-recorder``), recording nothing itself::

    run_script(RunSettings(output="trace.json.gz", duration=30.0), "train.py", ("--lr", "0.1"))  # exits as the script

``cli/main.py`` holds the command's options; this is what they run.
"""

from __future__ import annotations

import math
import os
import re
import runpy
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from polyprof.cli.render import EXIT_BAD_INPUT, fail, new_console
from polyprof.engine.signals import CleanStop, Signalled
from polyprof.errors import OutputPathError, PolyprofError


@dataclass(frozen=True)
class RunSettings:
    """``polyprof run``'s options (see its ``--help``)."""

    output: str = "polyprof_trace.json"
    activities: str | None = None
    duration: float | None = None
    summary: bool = True
    top: int = 10
    spill: bool | None = None
    ring: float | None = None
    min_span_us: float | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    exclude_kind: tuple[str, ...] = ()
    max_events: int | None = None
    on_demand: bool = False
    flight_seconds: float | None = None
    flight_dir: str = "flight"
    flight_options: tuple[str, ...] = ()
    torch_profiler: bool | None = None


def run_script(settings: RunSettings, script: str, script_args: tuple[str, ...]) -> NoReturn:
    """Run `script` as `settings` ask; exits with the script's status (or polyprof's, where the trace
    could not be written)."""
    if not os.path.isfile(script):
        fail(f"script {script} does not exist")
    _check_activity_settings()
    _behind_torch_profiler(settings.torch_profiler)
    if settings.on_demand:
        _run_on_demand(script, script_args)
    if settings.flight_options and settings.flight_seconds is None:
        fail("--flight-recorder-option needs --flight-recorder SECONDS")
    if settings.flight_seconds is not None:
        _run_flight_recorder(settings.flight_seconds, settings.flight_dir, settings.flight_options, script, script_args)
    for option, value in (("--duration", settings.duration), ("--ring", settings.ring)):
        if value is not None and not (math.isfinite(value) and value > 0):
            fail(f"{option} must be a positive, finite number of seconds, got {value}")
    ProfiledRun(settings, script).run(script_args)


class ProfiledRun:
    """One script under one profile: its window (from the start, or from the same optimizer step on every
    rank under torchrun with ``--duration``), a ``ProfilerStep#N`` span between its optimizer steps
    unless it marks its own, and a trace written once."""

    def __init__(self, settings: RunSettings, script: str) -> None:
        from polyprof.engine.scheduled import Profile
        from polyprof.formats import check_output_path
        from polyprof.formats.spill.file import spill_path
        from polyprof.merge.limits import limits_from_cli
        from polyprof.torch.steps import OptimizerStepSpans

        self.settings, self.script = settings, script
        try:
            _make_output_folder(settings.output)
            self.output = check_output_path(settings.output)
            groups = [a for a in (settings.activities.split(",") if settings.activities else []) if a.strip()] or None
            keep_spill = settings.ring is None if settings.spill is None else settings.spill
            self.spill_file = spill_path(self.output) if keep_spill else None
            _hint_leftover_spill(spill_path(self.output), self.output)
            limits = limits_from_cli(settings.min_span_us, settings.include, settings.exclude, settings.exclude_kind,
                                     settings.max_events)
            self.prof = Profile(groups, spill=self.spill_file, ring_s=settings.ring, limits=limits)
        except PolyprofError as exc:
            fail(str(exc))
        self.lock = threading.Lock()
        self.done: dict[str, Any] = {}  # "written": the trace's path, once written; "error": why not
        self.dumps = 0
        self.alarm: list[Callable[[], None]] = []
        self.synced: Any = None
        self.step_spans = OptimizerStepSpans()
        self.stop = CleanStop()

    def run(self, script_args: tuple[str, ...]) -> NoReturn:
        script_path = os.path.abspath(self.script)
        sys.argv = [self.script, *script_args]
        sys.path.insert(0, os.path.dirname(script_path))
        self.prof.yield_to = self.yield_to_the_scripts_profiler
        previous_usr2 = signal.signal(signal.SIGUSR2, self.dump_now) if hasattr(signal, "SIGUSR2") else None
        with self.stop:
            self._start()
            exit_code = self._report(self._execute(script_path))
        if previous_usr2 is not None:
            signal.signal(signal.SIGUSR2, previous_usr2)
        self.stop.exit()
        sys.exit(exit_code)

    def _start(self) -> None:
        from polyprof.torch.steps import SyncedStart, distributed_launch

        if self.settings.duration is not None and distributed_launch():  # every rank's window starts at the same step
            self.synced = SyncedStart(on_start=self.begin)
            self.synced.install()
        else:
            self.begin()

    def begin(self) -> None:
        """Start the window (and its --duration alarm), and the step spans."""
        if self.synced is not None:
            self.prof.add_metadata("polyprofRun", {"started_after_optimizer_step": self.synced.agreed_step,
                                                   "agreed_through": "the job's store", "problem": self.synced.problem})
        self.prof.start()
        self.step_spans.install()
        if self.settings.duration is not None:
            self.alarm.append(_stop_after(self.settings.duration, self.finish))

    def finish(self) -> None:
        """Stop and write the trace, once: when the window ends (--duration), or when the script does.
        Written at once, so that a process killed later keeps it."""
        with self.lock, self.stop.deferred():
            if self.done:
                return
            self.step_spans.remove()
            self.prof.stop()
            try:
                self.done["written"] = self.prof.export_chrome_trace(self.output)  # the spill goes once this is on disk
                click.echo(f"polyprof: trace written to {self.done['written']}", err=True)
            except PolyprofError as exc:
                self.done["error"] = str(exc)

    def dump_now(self, signum: int, frame: Any) -> None:
        """SIGUSR2: write what is recorded so far, and go on (for a job that hangs)."""
        output = self.output
        base, ext = (output[: -len(".json.gz")], ".json.gz") if output.endswith(".json.gz") else os.path.splitext(output)
        self.dumps += 1
        target = f"{base}.dump{self.dumps}{ext or '.json'}"
        try:
            with self.lock:
                click.echo(f"polyprof: SIGUSR2: recording so far written to {self.prof.dump(target)}", err=True)
        except PolyprofError as exc:
            click.echo(f"polyprof: SIGUSR2: no dump ({exc})", err=True)

    def yield_to_the_scripts_profiler(self, other: Any) -> None:
        """The script's own profiler (polyprof's behind torch.profiler, or torch's own) starts recording:
        only one profile records ops at a time, so this run's trace ends here and is written now."""
        whose = "polyprof behind it" if hasattr(other, "step_num") else "torch's own"
        click.echo(f"polyprof: the script started its own profiler (torch.profiler, {whose}): this run's trace "
                   "ends here; the script's profiler writes its own traces", err=True)
        self.prof.add_metadata("polyprofRun", {"ended": "the script started its own profiler",
                                               "step": getattr(other, "step_num", None)})
        self.finish()

    def _execute(self, script_path: str) -> int:
        """The script run to its end (or a signal's, or its failure's): its exit status; the trace is
        written on every way out."""
        exit_code = 0
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
            self.stop.interrupted()
            click.echo("polyprof: interrupted: writing the trace, then exiting", err=True)
        except BaseException:  # the script's own failure: report it like python would, keep the trace
            traceback.print_exc()
            exit_code = 1
        finally:
            for cancel in self.alarm:
                cancel()
            if self.synced is not None:
                self.synced.remove()
                if not self.synced.started:
                    self.done["error"] = (
                        "--duration under torchrun starts right after an optimizer step every rank agrees on; "
                        "the script made none after init_process_group, so nothing was recorded "
                        "(run without --duration to profile the whole script)"
                    )
            try:
                self.finish()
            except Signalled:  # came while the trace was written: it is written; exit as it asks below
                pass
        return exit_code

    def _report(self, exit_code: int) -> int:
        """What went wrong with the trace, else its summary (not after a signal); the exit status."""
        if "error" in self.done:
            click.echo(f"polyprof: error: {self.done['error']}", err=True)
            if self.spill_file and os.path.exists(self.spill_file):
                click.echo(f"polyprof: what was recorded is kept: polyprof recover {self.spill_file} -o OTHER.json.gz", err=True)
            return exit_code or EXIT_BAD_INPUT
        if self.settings.summary and self.stop.signum is None:
            from polyprof.cli.render import print_summary

            try:
                with self.stop.deferred():
                    print_summary(self.prof.trace, new_console(stderr=True), self.settings.top,
                                  f"polyprof summary: {os.path.basename(self.script)}")
            except Signalled:  # came while printing: the trace is written; exit as it asks
                pass
        return exit_code


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
