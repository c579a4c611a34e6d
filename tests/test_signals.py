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
    )  # fmt: skip
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
