"""`polyprof run` stopped by a scheduler or a terminal: SIGTERM, SIGHUP and SIGINT write the trace, then
the process ends with the signal's own status; a window that ended (--duration) is on disk at once."""

import gzip
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = """
import time, polyprof
for i in range(3):
    with polyprof.record_function(f"before the signal {i}"):
        pass
print("ready", flush=True)
while True:
    with polyprof.record_function("busy"):
        time.sleep(0.01)
"""


def _start(tmp_path, *args):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyprof", "run", "--activities", "cpu", *args, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _names(path):
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return [e.get("name") for e in json.loads(data)["traceEvents"]]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_writes_the_trace_and_ends_with_the_signals_status(tmp_path, sig):
    out = tmp_path / "t.json.gz"
    proc = _start(tmp_path, "-o", str(out))
    time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -sig, err
    names = _names(out)
    assert all(f"before the signal {i}" in names for i in range(3)) and "busy" in names
    assert "writing the trace" in err and "trace written to" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py", "t.json.gz"], "no temporary file left"


def test_a_window_that_ended_is_written_at_once_and_survives_a_kill(tmp_path):
    out = tmp_path / "t.json"
    proc = _start(tmp_path, "-o", str(out), "--duration", "0.3", "--no-summary")
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert "before the signal 0" in _names(out)


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


def test_sigusr2_dumps_the_recording_so_far_and_the_run_goes_on(tmp_path):
    out = tmp_path / "t.json"
    proc = _start(tmp_path, "-o", str(out), "--no-summary")
    time.sleep(0.1)
    proc.send_signal(signal.SIGUSR2)
    dump = tmp_path / "t.dump1.json"
    deadline = time.monotonic() + 30
    while not dump.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run goes on after the dump"
    assert "before the signal 0" in _names(dump)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM and "recording so far written to" in err
    assert "before the signal 0" in _names(out)


def test_the_api_turns_sigterm_into_a_clean_stop_with_handle_signals(tmp_path):
    out = tmp_path / "t.json"
    script = tmp_path / "api.py"
    script.write_text(textwrap.dedent(f"""
        import time, polyprof
        with polyprof.profile(["cpu"], handle_signals=True,
                              on_trace_ready=lambda p: p.export_chrome_trace({str(out)!r})):
            with polyprof.record_function("before the signal 0"):
                pass
            print("ready", flush=True)
            while True:
                with polyprof.record_function("busy"):
                    time.sleep(0.01)
        """))
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert "before the signal 0" in _names(out) and "Traceback" not in err


BIG_SCRIPT = """
import time, polyprof
for i in range(300_000):
    with polyprof.record_function("many"):
        pass
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_second_signal_while_the_trace_is_written_waits_for_it(tmp_path, second):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(BIG_SCRIPT))
    out = tmp_path / "t.json.gz"
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyprof", "run", "--activities", "cpu", "--no-spill", "-o", str(out), str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    line = proc.stderr.readline()
    assert "writing the trace" in line, line
    for _ in range(3):  # while the 300,000 spans are merged and compressed
        proc.send_signal(second)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, err
    assert "trace written to" in err and "Traceback" not in err
    assert _names(out).count("many") == 300_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py", "t.json.gz"]


def test_a_ring_run_keeps_the_last_seconds_and_writes_them_when_the_script_fails(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import time, polyprof
        with polyprof.record_function("early"):
            pass
        time.sleep(1.5)
        for i in range(20):
            with polyprof.record_function("late"):
                time.sleep(0.005)
        raise RuntimeError("the job fails")
        """))
    out = tmp_path / "t.json"
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "--activities", "cpu", "--ring", "0.5", "--no-summary",
                        "-o", str(out), str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and "RuntimeError: the job fails" in r.stderr
    names = _names(out)
    assert names.count("late") == 20 and "early" not in names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py", "t.json"], "no spill with --ring"
    bad = subprocess.run([sys.executable, "-m", "polyprof", "run", "--ring", "nan", str(script)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "--ring must be a positive, finite number" in bad.stderr


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


SECOND_SIGNAL_SCRIPT = """
import os, signal
from polyprof.engine.signals import CleanStop, Signalled
def ctrl_c(where):
    if where == WHERE:
        os.kill(os.getpid(), signal.SIGINT)
        print("noted", signal.Signals(stop.signum).name, flush=True)
with CleanStop() as stop:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    except Signalled:
        ctrl_c("before the writing")
    with stop.deferred():
        print("written", flush=True)
ctrl_c("after the block")
stop.exit()
"""


@pytest.mark.parametrize("where", ["before the writing", "after the block"])
def test_a_second_signal_between_the_first_and_the_exit_waits_for_it(tmp_path, where):
    """The windows around the trace's deferred block: after the Signalled unwound the program and
    before the writing starts, and after CleanStop's block and before its exit(). A Ctrl-C there (the
    second of a SIGTERM) is noted, not raised: the trace is written and the process ends as SIGTERM
    asked, not with a KeyboardInterrupt."""
    script = tmp_path / "s.py"
    script.write_text(f"WHERE = {where!r}" + SECOND_SIGNAL_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGTERM and "KeyboardInterrupt" not in r.stderr, r.stderr
    expected = ["noted", "SIGTERM", "written"] if where == "before the writing" else ["written", "noted", "SIGTERM"]
    assert r.stdout.split() == expected, r.stderr


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
