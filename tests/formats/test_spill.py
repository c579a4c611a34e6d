"""A killed `polyprof run` is recovered from its spill (SIGKILL, os._exit, a torn last chunk; JSON and
Perfetto outputs), a kill loses at most one flush interval, and a stopped profile's spill holds every
row until the trace is written."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SLOW_SCRIPT = """
import os, time, polyprof
print("ready", flush=True)
i = 0
while True:
    with polyprof.record_function(f"span {i}"):
        time.sleep(0.005)
    i += 1
    if i == 40:
        print("forty", flush=True)
"""


def _killed_run(tmp_path, body, out, kill=True):
    """`polyprof run -o out` of `body`, killed (SIGKILL) 2.5 s after its 40th span, or left to end
    itself; returns the environment it ran in."""
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyprof", "run", "--activities", "cpu", "-o", str(out), str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout.readline().strip() == "ready"
    if kill:
        assert proc.stdout.readline().strip() == "forty"
        time.sleep(2.5)  # the spans before "forty" ended more than a flush interval (1 s) ago
        proc.kill()
    proc.communicate(timeout=60)
    return env


@pytest.mark.parametrize("how", ["SIGKILL", "os._exit"])
def test_a_killed_run_is_recovered_from_its_spill(tmp_path, how):
    body = SLOW_SCRIPT if how == "SIGKILL" else SLOW_SCRIPT.replace('print("forty", flush=True)', 'time.sleep(1.5); os._exit(7)')
    out = tmp_path / "t.json.gz"
    env = _killed_run(tmp_path, body, out, kill=how == "SIGKILL")
    assert not out.exists(), "the run never wrote its trace"
    spill = tmp_path / ".t.json.gz.spill"
    assert spill.exists() and oct(spill.stat().st_mode & 0o777) == "0o600"
    r = subprocess.run([sys.executable, "-m", "polyprof", "recover", str(spill), "-o", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert all(f"span {i}" in names for i in range(40)), "every span that ended a flush interval before the end"
    assert "without a clean end" in doc["polyprof"]["partial"]["ended"]
    # the next run writing the same trace says how to recover the killed one's
    quick = tmp_path / "quick.py"
    quick.write_text("pass\n")
    again = subprocess.run([sys.executable, "-m", "polyprof", "run", "--activities", "cpu", "--no-summary", "-o", str(out),
                            str(quick)], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and "polyprof recover" in again.stderr and "was killed" in again.stderr
    (left,) = tmp_path.glob(".t.json.gz.spill.*.left")
    r = subprocess.run([sys.executable, "-m", "polyprof", "recover", str(left), "-o", str(tmp_path / "r2.json")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not left.exists(), "a recovered .left copy is removed"


def test_a_torn_last_chunk_still_recovers(tmp_path):
    import polyprof
    from polyprof.formats.spill.recover import recover_trace

    path = tmp_path / ".x.spill"
    prof = polyprof.profile(["cpu"], spill=path, flush_interval_s=0.05)
    prof.start()
    for i in range(20):
        with polyprof.record_function(f"s{i}"):
            time.sleep(0.01)
    time.sleep(0.2)
    size = path.stat().st_size
    prof.stop()
    with open(path, "r+b") as f:  # cut the file inside the chunks written after `size`
        f.truncate(size - 7)
    trace = recover_trace(str(path))
    names = [a.name for a in trace.activities]
    assert "s0" in names and trace.metadata["polyprof"]["partial"]["torn_bytes"] > 0


@pytest.mark.parametrize("wait", [True, False], ids=["stop", "stop(wait=False)"])
def test_a_stopped_profiles_spill_holds_every_row_until_a_trace_is_written(tmp_path, wait):
    """If the export fails after a clean stop, the spill is the whole recording: rows after the last
    flush and the window's collect included, with the clean end after them."""
    import polyprof
    from polyprof.formats.spill.file import read_spill
    from polyprof.formats.spill.recover import recover_trace

    path = tmp_path / ".x.spill"
    prof = polyprof.profile(["cpu"], spill=path, flush_interval_s=60)  # no flush comes in this test
    prof.start()
    for i in range(50):
        with polyprof.record_function(f"s{i}"):
            pass
    prof.stop(wait=wait)
    prof.trace  # noqa: B018 - waits for the window's merge
    assert read_spill(str(path)).ended
    trace = recover_trace(str(path))
    assert sorted(a.name for a in trace.activities if a.name.startswith("s")) == sorted(f"s{i}" for i in range(50))
    assert trace.metadata["polyprof"]["partial"]["missing"].startswith("nothing")
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert not path.exists(), "the spill goes once a trace is written"


def test_a_pftrace_runs_spill_is_itself_a_perfetto_trace_after_a_kill(tmp_path):
    """For a .pftrace output the spill is appended as Perfetto packets: after SIGKILL it opens as a
    trace (read here with the perfetto package's classes), cut at any byte it still recovers."""
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2", reason="needs the perfetto package (test extra)")
    from test_export_perfetto import Parsed

    from polyprof.formats.spill.recover import recover_trace

    out = tmp_path / "t.pftrace"
    env = _killed_run(tmp_path, SLOW_SCRIPT, out)
    spill = tmp_path / ".t.spill.pftrace"
    assert not out.exists() and spill.exists() and oct(spill.stat().st_mode & 0o777) == "0o600"
    data = spill.read_bytes()
    parsed = Parsed(data, sequences=None)
    names = {s["name"] for s in parsed.slices}
    assert all(f"span {i}" in names for i in range(40)) and not parsed.unclosed
    spill.write_bytes(data[: len(data) - 5])  # a write cut short by the kill
    trace = recover_trace(str(spill))
    assert {f"span {i}" for i in range(40)} <= {a.name for a in trace.activities}
    assert trace.metadata["polyprof"]["partial"]["torn_bytes"] > 0
    if importlib.util.find_spec("duckdb") is not None:  # the store reads it as recover does (the store extra)
        from polyprof import store

        store.write_store([spill], tmp_path / "job.polyprof", jobs=1)
        stored = store.open(tmp_path / "job.polyprof").table("select name from activities")["name"].to_pylist()
        assert {f"span {i}" for i in range(40)} <= set(stored)
    r = subprocess.run([sys.executable, "-m", "polyprof", "recover", str(spill), "-o", str(tmp_path / "r.pftrace")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert {f"span {i}" for i in range(40)} <= {s["name"] for s in Parsed((tmp_path / "r.pftrace").read_bytes()).slices}


def test_a_kill_loses_at_most_one_flush_interval_from_the_first_100_ms_on(tmp_path):
    """The spill's first hand-over comes 0.1 s into the run and each next one early by what a flush
    takes: killed at 0.35 s, the run leaves spans; killed at 2.6 s, what it lost (from the last span
    recovered to the kill) is under the 1 s flush interval."""
    from polyprof.formats.spill.recover import recover_trace
    from polyprof.model import ActivityKind

    script = tmp_path / "spans.py"
    script.write_text(SLOW_SCRIPT)
    for after_s in (0.35, 2.6):
        out = tmp_path / f"t{after_s}.json"
        proc = subprocess.Popen([sys.executable, "-m", "polyprof", "run", "--activities", "cpu", "-o", str(out), str(script)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "POLYPROF_BACKENDS": ""})
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(after_s)
        killed_at = time.time_ns()
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        trace = recover_trace(str(tmp_path / f".t{after_s}.json.spill"))
        spans = [a for a in trace.activities_of(ActivityKind.USER_ANNOTATION) if a.name.startswith("span ")]
        assert spans, f"killed {after_s} s in: nothing recovered"
        lost_s = (killed_at - (max(a.end for a in spans) + trace.epoch_offset_ns)) / 1e9
        assert lost_s < 1.0 + 0.15, f"killed {after_s} s in, the last {lost_s:.2f} s were lost"
