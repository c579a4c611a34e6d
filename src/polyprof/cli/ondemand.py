"""``polyprof ps`` and ``polyprof capture``: the on-demand commands (see :mod:`polyprof.ondemand`).

::

    polyprof ps                                        # this user's capturable processes
    polyprof capture 4242 --duration 5                 # writes polyprof-capture-4242.json.gz, prints a summary
    polyprof capture 4242 --steps 3 -o cap.json.gz     # three steps, from the next step boundary
    polyprof capture 4242 --job --steps 3 -o job.json.gz   # every rank of its job, merged into job.json.gz
    polyprof capture --all --duration 2 -o all.json.gz      # every capturable process, merged
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import click
from rich.table import Table

from polyprof.cli.render import fail, markup_safe, new_console
from polyprof.errors import PolyprofError, TraceFormatError


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per process instead of a table.")
def ps(as_json: bool) -> None:
    """List this user's capturable processes (started with POLYPROF_ON_DEMAND=1, polyprof run
    --on-demand, or polyprof.listen())."""
    from polyprof.ondemand.client import capturable

    try:
        found = capturable()
    except PolyprofError as exc:
        fail(str(exc))
    if as_json:
        import orjson

        for proc in found:
            click.echo(orjson.dumps(proc).decode())
        return
    if not found:
        click.echo("polyprof: no capturable process of this user (start one with POLYPROF_ON_DEMAND=1)", err=True)
        return
    table = Table(title="polyprof: capturable processes", title_justify="left")
    for col in ("PID", "Command", "Rank", "Steps", "Capture"):
        table.add_column(col, no_wrap=col in ("PID", "Command"), overflow="ellipsis", max_width=60 if col == "Command" else None)
    for proc in found:
        rank = f"{proc['rank']}/{proc['world_size']}" if proc.get("distributed") else "-"
        steps = f"{proc.get('steps', 0)} ({', '.join(proc.get('step_sources') or [])})" if proc.get("step_sources") else "none seen (--duration only)"
        cap = proc.get("capture")
        running = "error: " + proc["error"] if "error" in proc else (
            ("recording" if cap.get("recording") else "waiting for its step") + f" -> {cap.get('output')}" if cap else "-")
        table.add_row(str(proc["pid"]), markup_safe(_short_command(str(proc.get("command", "")))), rank, steps,
                      markup_safe(running))
    new_console().print(table)


def _short_command(command: str) -> str:
    """The command with its script named by its file name (the folders make it too wide)."""
    first, _, rest = command.partition(" ")
    return f"{os.path.basename(first)} {rest}".strip()


@click.command()
@click.argument("pid", type=int, required=False)
@click.option("--duration", type=float, default=None, help="Record this many seconds, from now.")
@click.option("--steps", type=int, default=None, help="Record this many training steps, from the next step boundary.")
@click.option("--last", "last_s", type=float, default=None, metavar="SECONDS",
              help="Write the last SECONDS its flight recorder holds, now (polyprof run --flight-recorder, "
              "POLYPROF_FLIGHT_RECORDER).")
@click.option("--activities", default=None, help="Comma-separated activity groups (e.g. cpu,cuda); default: all available.")
@click.option("-o", "--output", default=None, help="Trace to write (default polyprof-capture-PID.json.gz here); "
              "for --job / --all, the merged trace, each process's own beside it.")
@click.option("--job", is_flag=True, help="Capture every rank of PID's torch.distributed job, the same steps on each, and merge them.")
@click.option("--all", "everyone", is_flag=True, help="Capture every capturable process of this user, and merge them.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="How long a steps capture waits for its first step (a job: for its ranks to report).")
@click.option("--summary/--no-summary", default=True, show_default=True, help="Print the top activities when done.")
@click.option("--top", type=int, default=10, show_default=True, help="Rows per kind and device in the summary.")
def capture(pid: int | None, duration: float | None, steps: int | None, last_s: float | None, activities: str | None,
            output: str | None, job: bool, everyone: bool, timeout: float, summary: bool, top: int) -> None:
    """Capture a running process PID (see polyprof ps) for --duration seconds or --steps steps: it
    records, writes the trace itself, and this prints the summary. Ctrl-C here leaves the capture to
    finish in the target."""
    if sum(v is not None for v in (duration, steps, last_s)) != 1:
        fail("give exactly one of --duration SECONDS, --steps N and --last SECONDS")
    if last_s is not None and not (math.isfinite(last_s) and last_s > 0):
        fail(f"--last must be a positive number of seconds, got {last_s}")
    if last_s is not None and (job or everyone):
        fail("--last asks one process's flight recorder; each rank's writes its own (SIGUSR2 to one rank: every rank)")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        fail(f"--duration must be a positive number of seconds, got {duration}")
    if steps is not None and steps < 1:
        fail(f"--steps must be at least 1, got {steps}")
    if everyone == (pid is not None):
        fail("give the PID to capture (polyprof ps lists them), or --all")
    if job and everyone:
        fail("--job captures PID's job; --all captures every process (each job among them as a whole)")
    output = os.path.abspath(output or f"polyprof-capture-{pid if pid is not None else 'all'}.json.gz")
    if not os.path.isdir(os.path.dirname(output)):
        fail(f"cannot write the trace to {output}: folder {os.path.dirname(output)} does not exist; create it first")
    request: dict[str, Any] = {"op": "capture", "output": output, "timeout_s": timeout}
    request.update({"duration_s": duration} if duration is not None else
                   {"steps": steps} if steps is not None else {"last_s": last_s})
    if activities:
        request["activities"] = [a.strip() for a in activities.split(",") if a.strip()]
    if everyone:
        paths = _capture_all(request, output)
    else:
        assert pid is not None
        paths = _capture_one(pid, {**request, "job": job})
    _report(paths, output, summary, top)


def _capture_one(pid: int, request: dict[str, Any]) -> list[str]:
    from polyprof.ondemand.client import CaptureFailed, ask_capture

    def accepted(info: dict[str, Any]) -> None:
        how = (f"{info['steps']} steps" if info.get("steps") else f"the last {info['last_s']:g} s" if info.get("last_s")
               else f"{info.get('duration_s')} s")
        where = info.get("job") or {}
        if where:
            click.echo(f"polyprof: capturing {how} on all {where['world_size']} ranks of pid {pid}'s job, from step "
                       f"{where['start_step']} -> {where['output']}", err=True)
        else:
            note = f" ({info['note']})" if info.get("note") else ""
            click.echo(f"polyprof: capturing {how} of pid {pid} -> {info.get('output')}{note}", err=True)

    try:
        done = ask_capture(pid, request, accepted)
    except CaptureFailed as exc:
        fail(f"pid {pid}: {exc}")
    except KeyboardInterrupt:
        click.echo(f"polyprof: interrupted; pid {pid} finishes the capture and writes its trace itself", err=True)
        raise SystemExit(130) from None
    if "ranks" in done:
        return [_rank_trace(r["done"]["path"]) for _, r in sorted(done["ranks"].items(), key=lambda kv: int(kv[0]))]
    return [done["path"]]


def _rank_trace(path: object) -> str:
    """A rank's trace path as its report in the job's store gives it (which any local process that
    reaches the store can write): read only when it is a trace file of yours, not a link."""
    import stat

    from polyprof.ondemand.job import TRACE_SUFFIXES

    try:
        st = os.lstat(str(path))
    except OSError as exc:
        fail(f"a rank reported {path!r} as its trace: {exc.strerror or exc}")
    if not (isinstance(path, str) and path.endswith(TRACE_SUFFIXES) and stat.S_ISREG(st.st_mode)
            and st.st_uid == os.getuid()):
        fail(f"a rank reported {path!r} as its trace, which is not a trace file of yours (uid {os.getuid()}): not read")
    return path


def _capture_all(request: dict[str, Any], output: str) -> list[str]:
    """Every capturable process: a job's ranks through one of them (its lowest rank), the others each."""
    from polyprof.ondemand.client import capturable

    found = [p for p in capturable() if "error" not in p and p.get("pid") != os.getpid()]
    if not found:
        fail("no capturable process of this user (start one with POLYPROF_ON_DEMAND=1)")
    jobs: dict[str, dict[str, Any]] = {}
    singles = []
    for proc in found:
        if proc.get("distributed") and proc.get("job"):
            best = jobs.get(proc["job"])
            if best is None or proc.get("rank", 0) < best.get("rank", 0):
                jobs[proc["job"]] = proc
        else:
            singles.append(proc)
    stem, suffix = _split_suffix(output)
    asks = [(p["pid"], {**request, "output": f"{stem}.pid{p['pid']}{suffix}"}) for p in singles]
    asks += [(p["pid"], {**request, "job": True, "output": f"{stem}.job{i}{suffix}"}) for i, p in enumerate(jobs.values())]
    results: dict[int, list[str]] = {}
    errors: list[str] = []

    def one(pid: int, req: dict[str, Any]) -> None:
        try:
            results[pid] = _capture_one(pid, req)
        except SystemExit:
            errors.append(str(pid))

    threads = [threading.Thread(target=one, args=ask, daemon=True) for ask in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not results:
        fail("no process wrote a trace")
    return [p for pid in sorted(results) for p in results[pid]]


def _split_suffix(path: str) -> tuple[str, str]:
    for suffix in (".json.gz", ".pftrace.gz", ".json", ".pftrace"):
        if path.endswith(suffix):
            return path[: -len(suffix)], suffix
    return path, ""


def _report(paths: list[str], output: str, summary: bool, top: int) -> None:
    from polyprof.cli.render import print_rank_view, print_summary
    from polyprof.formats import load_trace

    if len(paths) == 1:
        click.echo(f"polyprof: trace written to {paths[0]}", err=True)
        if summary:
            try:
                print_summary(load_trace(paths[0]), new_console(), top, f"polyprof capture: {paths[0]}")
            except TraceFormatError as exc:
                fail(str(exc))
        return
    from polyprof.tools.merge_ranks import merge_traces

    try:
        stats = merge_traces(paths, output)
    except (TraceFormatError, PolyprofError) as exc:
        fail(f"the traces {', '.join(paths)} were written but not merged: {exc}")
    click.echo(f"polyprof: {len(paths)} traces written ({', '.join(paths)}), merged into {stats.output}", err=True)
    if summary:
        from polyprof.analysis.ranks import rank_view

        try:
            print_rank_view(rank_view(paths), new_console())
        except (TraceFormatError, PolyprofError) as exc:
            click.echo(f"polyprof: no rank view ({exc})", err=True)
