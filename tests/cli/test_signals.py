"""`polyprof run` stopped by a scheduler or a terminal: SIGTERM, SIGHUP and SIGINT write the trace, then
the process ends with the signal's own status; a window that ended (--duration) is on disk at once."""

import gzip
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
