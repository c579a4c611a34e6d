"""Long commands show a progress bar on a terminal, and nothing extra when stderr is not one or with
--quiet."""

import os
import pty
import subprocess
import sys

import polyprof


def _trace(path, n=2000):
    with polyprof.profile(["cpu"]) as prof:
        for i in range(n):
            with polyprof.record_function(f"work {i % 7}"):
                pass
    prof.export_chrome_trace(str(path))
    return path


def _on_a_terminal(*args):
    """The command with its stderr on a pseudo-terminal: (exit status, what the terminal showed)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "polyprof", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the command ended and closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=120), shown.decode(errors="replace")


def test_convert_merge_store_summary_sql_and_recover_show_a_bar_on_a_terminal_only(tmp_path):
    from test_store_spill_stream import _job_rank, _spill

    a, b = _trace(tmp_path / "a.json"), _trace(tmp_path / "b.json")
    spill = _spill(_job_rank(steps=4), tmp_path / "run.spill", flushes=3)
    perfetto_spill = _spill(_job_rank(steps=4), tmp_path / ".run.spill.pftrace", flushes=3, perfetto=True)
    from polyprof.store import write_store

    job = write_store([a, b], tmp_path / "job.polyprof").path
    cases = [
        (lambda out: ("summary", job), "ranks analysed"),
        (lambda out: ("sql", job, "select * from steps"), "ranks analysed"),
        (lambda out: ("convert", a, out / "a.pftrace"), "converted bytes"),
        (lambda out: ("merge", a, b, "-o", out / "m.json"), "ranks merged"),
        (lambda out: ("store", a, b, "-o", out / "job.polyprof"), "stored trace bytes"),
        (lambda out: ("summary", a, b), "traces read"),
        (lambda out: ("recover", spill, "-o", out / "r.json"), "spill bytes read"),
        (lambda out: ("recover", perfetto_spill, "-o", out / "r.json"), "spill bytes read"),
    ]
    for case, (command, words) in enumerate(cases):
        for how in ("terminal", "quiet", "piped"):
            out = tmp_path / f"{case}-{how}"
            out.mkdir()
            args = command(out)
            if how == "piped":
                r = subprocess.run([sys.executable, "-m", "polyprof", *map(str, args)], capture_output=True, text=True,
                                   timeout=120)
                status, shown = r.returncode, r.stderr
            else:
                status, shown = _on_a_terminal(*args, *(["-q"] if how == "quiet" else []))
            assert status == 0, (args, shown[-500:])
            assert (words in shown) == (how == "terminal"), (how, args, shown[-500:])
