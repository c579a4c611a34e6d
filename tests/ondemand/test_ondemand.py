"""On-demand capture of running processes: real processes, real Unix sockets, the real CLI.

Targets are started with POLYPROF_ON_DEMAND=1 and do not import polyprof (polyprof's .pth file makes
them capturable); each test gets its own socket folder through XDG_RUNTIME_DIR."""

import contextlib
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from polyprof.ondemand import channel
from polyprof.ondemand.protocol import RequestError, parse_request

TARGET = r"""
import os, sys, time
stop_file = sys.argv[1]
if "--torch" in sys.argv:
    import torch
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def work():
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
else:
    def work():
        sum(i * i for i in range(2000))
deadline = time.time() + 120
while not os.path.exists(stop_file) and time.time() < deadline:
    work()
    time.sleep(0.01)
if "--exit-hard" in sys.argv:
    os._exit(0)
"""


@pytest.fixture
def runtime(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    return folder


def _env(runtime, **extra):
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "POLYPROF_BACKENDS": "", "OMP_NUM_THREADS": "1", **extra}


class Target:
    """A script started with POLYPROF_ON_DEMAND=1 that runs until told to stop."""

    def __init__(self, tmp_path, runtime, *args, on_demand="1", command=None):
        self.script = tmp_path / "target.py"
        self.script.write_text(TARGET)
        self.stop_file = tmp_path / f"stop-{time.monotonic_ns()}"
        self.runtime = runtime
        cmd = [*(command or [sys.executable]), str(self.script)]
        self.proc = subprocess.Popen([*cmd, str(self.stop_file), *args], env=_env(runtime, POLYPROF_ON_DEMAND=on_demand),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        self.pid = self.proc.pid
        self.socket = runtime / "polyprof" / f"{self.pid}.sock"

    def wait_listening(self, timeout=60):
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            assert self.proc.poll() is None, self.proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the target never listened"
            time.sleep(0.05)
        return self

    def wait_steps(self, n=5, timeout=60):
        """Until the training loop runs (torch imported, `n` optimizer steps made)."""
        deadline = time.monotonic() + timeout
        while (_ask(self.runtime, self.pid, {"op": "status"}) or {}).get("steps", 0) < n:
            assert time.monotonic() < deadline, "the target never made its steps"
            time.sleep(0.05)
        return self

    def finish(self, timeout=60):
        self.stop_file.touch()
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err


@pytest.fixture
def targets():
    started = []
    yield started
    for t in started:
        t.stop_file.touch()
        if t.proc.poll() is None:
            try:
                t.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                t.proc.kill()


def _cli(runtime, *args, timeout=120, check=True):
    r = subprocess.run([sys.executable, "-m", "polyprof", *args], env=_env(runtime), capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _ask(runtime, pid, message, raw=None, timeout=10):
    """One request over the target's socket; the reply (None when the target closed without one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(runtime / "polyprof" / f"{pid}.sock"))
        try:
            s.sendall(raw if raw is not None else json.dumps(message).encode() + b"\n")
            s.shutdown(socket.SHUT_WR)  # all said: a request without its newline ends here
        except OSError:
            pass  # the target stopped reading (a message over the limit)
        try:
            return channel.receive(s, limit=1 << 20)
        except channel.ChannelError:
            return None


def _wait_idle(runtime, pid, timeout=30):
    """Until the target's capture slot is free again (its last capture's trace is written)."""
    deadline = time.monotonic() + timeout
    while _ask(runtime, pid, {"op": "status"})["capture"] is not None:
        assert time.monotonic() < deadline, "the capture slot was never released"
        time.sleep(0.05)


def _events(path):
    return json.loads(open(path).read())["traceEvents"]


def _steps(path):
    return sorted(int(e["name"][13:]) for e in _events(path) if str(e.get("name", "")).startswith("ProfilerStep#"))


def test_a_script_without_polyprof_is_captured_twice_by_duration_and_once_by_steps(tmp_path, runtime, targets):
    pytest.importorskip("torch", reason="needs torch for the training loop")
    target = Target(tmp_path, runtime, "--torch")
    targets.append(target)
    assert "polyprof" not in target.script.read_text()
    target.wait_listening().wait_steps()
    listed = [json.loads(line) for line in _cli(runtime, "ps", "--json").stdout.splitlines()]
    assert [p["pid"] for p in listed] == [target.pid] and listed[0]["capture"] is None
    table = _cli(runtime, "ps").stdout
    assert str(target.pid) in table and "target.py" in table
    for n in (1, 2):
        r = _cli(runtime, "capture", str(target.pid), "--duration", "0.5", "-o", str(tmp_path / f"d{n}.json"))
        assert f"trace written to {tmp_path / f'd{n}.json'}" in r.stderr and "aten::" in r.stdout, r.stderr
        names = {e.get("name") for e in _events(tmp_path / f"d{n}.json")}
        assert "aten::addmm" in names, "the training thread's ops, though polyprof's thread started the capture"
    r = _cli(runtime, "capture", str(target.pid), "--steps", "3", "-o", str(tmp_path / "s.json"))
    steps = _steps(tmp_path / "s.json")
    assert len(steps) == 3 and steps == list(range(steps[0], steps[0] + 3)) and steps[0] > 0, steps
    meta = json.loads((tmp_path / "s.json").read_text())["polyprofCapture"]
    assert meta["steps"] == 3
    code, err = target.finish()
    assert code == 0 and "Traceback" not in err, err
    assert not target.socket.exists(), "the socket goes with the process"


def test_the_socket_folder_and_the_socket_are_private(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    folder = runtime / "polyprof"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
    assert stat.S_ISSOCK(target.socket.stat().st_mode) and stat.S_IMODE(target.socket.stat().st_mode) == 0o600
    # a folder open to others, or one that is a link, is refused with what to do
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / "polyprof").mkdir(mode=0o755)
    os.chmod(other / "polyprof", 0o755)
    r = subprocess.run([sys.executable, "-c", "import polyprof; polyprof.listen()"], env=_env(other), capture_output=True, text=True)
    assert r.returncode != 0 and "is open to others (mode 755, must be 700)" in r.stderr and "remove it" in r.stderr
    linked = tmp_path / "linked"
    linked.mkdir(mode=0o700)
    (linked / "polyprof").symlink_to(folder)
    r = subprocess.run([sys.executable, "-c", "import polyprof; polyprof.listen()"], env=_env(linked), capture_output=True, text=True)
    assert r.returncode != 0 and "is not a folder (a link or a file)" in r.stderr
    # with POLYPROF_ON_DEMAND, the same refusal is said as the script starts, and the program runs on
    script = tmp_path / "script.py"
    script.write_text("print('still ran')")
    r = subprocess.run([sys.executable, str(script)], env=_env(other, POLYPROF_ON_DEMAND="1"), capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "still ran\n" and "cannot be made capturable" in r.stderr


SYSTEM_PYTHON = "/usr/bin/python3"  # nobody can run it (not the project's venv, under root's folders)


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("runuser") or not os.path.exists(SYSTEM_PYTHON),
                    reason="needs root, runuser and /usr/bin/python3 to act as another user")
def test_a_request_from_another_user_is_refused_and_logged(tmp_path, targets):
    base = tempfile.mkdtemp(prefix="polyprof-od-")  # outside pytest's 0700 folder, so that nobody can reach it
    try:
        os.chmod(base, 0o700)
        runtime = __import__("pathlib").Path(base)
        target = Target(tmp_path, runtime).wait_listening()
        targets.append(target)
        for path in (base, runtime / "polyprof"):
            os.chmod(path, 0o711)  # a folder someone opened up: the peer check still holds
        os.chmod(target.socket, 0o666)
        probe = textwrap.dedent(f"""
            import json, socket
            s = socket.socket(socket.AF_UNIX); s.connect({str(target.socket)!r})
            try:
                s.sendall(json.dumps({{"op": "capture", "duration_s": 1, "output": {str(runtime / "x.json")!r}}}).encode() + b"\\n")
            except BrokenPipeError:
                pass  # refused and closed before the request went out: the refusal is still there to read
            print(s.recv(4096).decode())
        """)
        r = subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"ok": False, "error": "refused: this process belongs to another user"}
        assert _ask(runtime, target.pid, {"op": "status"})["refused"] == 1
        assert not (runtime / "x.json").exists()
        code, err = target.finish()
        assert code == 0 and "refused a request from uid" in err and "only uid 0 or root" in err, err
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _malformed(rnd):
    """One hostile or broken request (bytes on the wire)."""
    good = {"op": "capture", "duration_s": 1.0, "output": "/tmp/never.json"}
    kind = rnd.randrange(10)
    if kind == 0:
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 300))) + b"\n"
    if kind == 1:
        text = json.dumps(good)
        return text[: rnd.randrange(1, len(text))].encode() + b"\n"
    if kind == 2:
        return b"x" * (channel.MAX_MESSAGE_BYTES + rnd.randrange(1, 5000))
    if kind == 3:
        return b"[" * rnd.randrange(1, 5000) + b"\n"
    if kind == 4:
        bad = dict(good)
        key = rnd.choice(["duration_s", "steps", "output", "activities", "job", "timeout_s", "op"])
        bad[key] = rnd.choice([None, -1, 0, 1e300, "1", [], {}, True, "relative/path", "\u0000", 2**70, "/" + "a" * 5000])
        return json.dumps(bad).encode() + b"\n"
    if kind == 5:
        return json.dumps({**good, "steps": 3}).encode() + b"\n"  # both ways at once
    if kind == 6:
        return json.dumps({**good, rnd.choice(["rm", "exec", "__class__"]): 1}).encode() + b"\n"
    if kind == 7:
        return json.dumps(rnd.choice([1, "status", [], None, {"op": "shutdown"}, {"op": "status", "x": 1}])).encode() + b"\n"
    if kind == 8:
        return b'{"op": "capture", "duration_s": NaN, "output": "/tmp/n.json"}\n'
    return b""  # connect and say nothing


def test_a_fuzz_of_malformed_requests_leaves_the_target_unharmed(tmp_path, runtime, targets, monkeypatch):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    rnd = random.Random(17)
    errors = 0
    for i in range(1200):
        message = _malformed(rnd)
        reply = _ask(runtime, target.pid, None, raw=message, timeout=5)
        assert reply is None or (reply["ok"] is False and reply["error"]), (i, message[:200], reply)
        errors += reply is not None
    assert errors > 900, "nearly every malformed request gets a reason back"
    assert target.proc.poll() is None
    status = _ask(runtime, target.pid, {"op": "status"})
    assert status["ok"] and status["capture"] is None
    r = _cli(runtime, "capture", str(target.pid), "--duration", "0.3", "-o", str(tmp_path / "after.json"), "--no-summary")
    assert (tmp_path / "after.json").exists(), r.stderr
    assert not any(tmp_path.glob("never*")) and not os.path.exists("/tmp/never.json")
    code, err = target.finish()
    assert code == 0 and "Traceback" not in err, err[-3000:]


def test_a_slow_peer_holds_only_its_own_connection(tmp_path, runtime, targets):
    """A peer that sends one byte every half second, and idle connections, neither hold the listener:
    polyprof ps gets its status within 2 s meanwhile, the slow request is dropped 2 s after it
    connected (whatever it sends), and twelve clients at once are all answered."""
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    path = str(target.socket)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(path)
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(8)]
    for s in idle:
        s.connect(path)
    opened = time.monotonic()
    slow.settimeout(0.5)
    reply = b""
    asked_at = None
    for byte in b'{"op": "status"':  # never ends its line
        try:
            slow.sendall(bytes([byte]))
            reply = slow.recv(4096)
        except TimeoutError:
            pass
        except OSError:  # closed while `ps` ran (a loaded machine): its reply was sent before it closed
            with contextlib.suppress(OSError):
                reply = reply or slow.recv(4096)
            break
        if reply:
            break
        if asked_at is None and time.monotonic() - opened > 0.6:
            asked_at = time.monotonic()
            r = _cli(runtime, "ps", "--json")
            answered = time.monotonic() - asked_at
            assert answered < 2.0, f"status took {answered:.1f} s while another connection dawdled"
            assert str(target.pid) in r.stdout
    dropped_after = time.monotonic() - opened
    assert b"did not end within 2 s" in reply, reply
    assert 1.9 <= dropped_after <= 3.5, dropped_after
    for s in [slow, *idle]:
        s.close()
    results = []

    def ask():
        results.append(_ask(runtime, target.pid, {"op": "status"}))

    import threading

    clients = [threading.Thread(target=ask) for _ in range(12)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(30)
    assert len(results) == 12 and all(r and r.get("ok") for r in results), results


def test_the_request_parser_says_what_is_wrong():
    cases = [
        ([], "a JSON object"),
        ({"op": "shutdown"}, "unknown op"),
        ({"op": "status", "x": 1}, "status takes no fields"),
        ({"op": "capture", "output": "rel.json", "steps": 1}, "absolute path"),
        ({"op": "capture", "output": "/a.json"}, "exactly one of duration_s, steps and last_s"),
        ({"op": "capture", "output": "/a.json", "steps": 0}, "from 1 to"),
        ({"op": "capture", "output": "/a.json", "steps": True}, "whole number"),
        ({"op": "capture", "output": "/a.json", "duration_s": -1}, "more than 0"),
        ({"op": "capture", "output": "/a.json", "last_s": 0}, "last_s must be more than 0"),
        ({"op": "capture", "output": "/a.json", "last_s": 5, "steps": 2}, "exactly one of"),
        ({"op": "capture", "output": "/a.json", "duration_s": 1, "activities": "cpu"}, "list of 1 to 32"),
        ({"op": "capture", "output": "/a.json", "duration_s": 1, "activities": []}, "list of 1 to 32"),
        ({"op": "capture", "output": "/a.json", "duration_s": 1, "steps": None}, "steps: null is not a value"),
        ({"op": "capture", "output": "/a.json", "duration_s": 1, "rm": 1}, "unknown fields ['rm']"),
        ({"op": "capture", "output": "/a.json", "duration_s": 1, "job": "yes"}, "true or false"),
    ]
    for message, says in cases:
        with pytest.raises(RequestError, match=says.replace("[", r"\[").replace("]", r"\]")):
            parse_request(message)
    ok = parse_request({"op": "capture", "output": "/a.json", "steps": 3, "activities": ["cpu"], "job": True})
    assert (ok.steps, ok.activities, ok.job, ok.duration_s) == (3, ("cpu",), True, None)


def test_a_second_capture_while_one_runs_is_refused_with_the_reason(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    first = subprocess.Popen([sys.executable, "-m", "polyprof", "capture", str(target.pid), "--duration", "3", "-o",
                              str(tmp_path / "first.json"), "--no-summary"], env=_env(runtime),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (_ask(runtime, target.pid, {"op": "status"}) or {}).get("capture"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = _cli(runtime, "capture", str(target.pid), "--duration", "1", "-o", str(tmp_path / "second.json"), check=False)
    assert second.returncode == 2 and "a capture is already running in this process" in second.stderr, second.stderr
    assert first.wait(timeout=60) == 0 and (tmp_path / "first.json").exists()
    assert not (tmp_path / "second.json").exists()


def test_a_cli_killed_mid_capture_leaves_the_target_running_and_the_trace_written(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    cli = subprocess.Popen([sys.executable, "-m", "polyprof", "capture", str(target.pid), "--duration", "1.5", "-o",
                            str(tmp_path / "orphan.json")], env=_env(runtime), stderr=subprocess.PIPE, text=True)
    assert "capturing" in cli.stderr.readline()
    cli.kill()
    cli.wait()
    deadline = time.monotonic() + 30
    while not (tmp_path / "orphan.json").exists():
        assert time.monotonic() < deadline, "the target wrote its trace with nobody waiting"
        time.sleep(0.1)
    assert target.proc.poll() is None
    _wait_idle(runtime, target.pid)
    _cli(runtime, "capture", str(target.pid), "--duration", "0.2", "-o", str(tmp_path / "again.json"), "--no-summary")
    code, err = target.finish()
    assert code == 0 and "Traceback" not in err, err


def test_a_target_that_exits_mid_capture_writes_its_trace_and_a_killed_one_leaves_a_spill(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    cli = subprocess.Popen([sys.executable, "-m", "polyprof", "capture", str(target.pid), "--duration", "60", "-o",
                            str(tmp_path / "exit.json"), "--no-summary"], env=_env(runtime), stderr=subprocess.PIPE, text=True)
    assert "capturing" in cli.stderr.readline()
    time.sleep(0.5)
    code, err = target.finish()  # the script ends 59 s before the capture would
    assert code == 0 and "Traceback" not in err, err
    assert cli.wait(timeout=60) == 0
    doc = json.loads((tmp_path / "exit.json").read_text())
    assert "the process exited mid-capture" in " ".join(doc["polyprofCaptureNotes"])
    killed = Target(tmp_path, runtime).wait_listening()
    targets.append(killed)
    cli = subprocess.Popen([sys.executable, "-m", "polyprof", "capture", str(killed.pid), "--duration", "60", "-o",
                            str(tmp_path / "killed.json"), "--no-summary"], env=_env(runtime), stderr=subprocess.PIPE, text=True)
    assert "capturing" in cli.stderr.readline()
    spill = tmp_path / ".killed.json.spill"
    deadline = time.monotonic() + 30
    while not spill.exists() or spill.stat().st_size < 200:
        assert time.monotonic() < deadline, "the capture spills while it records"
        time.sleep(0.1)
    time.sleep(1.5)  # a flush of rows after the header
    killed.proc.kill()
    killed.proc.wait()
    assert cli.wait(timeout=60) == 2 and "polyprof recover" in cli.stderr.read()
    r = _cli(runtime, "recover", str(spill), "-o", str(tmp_path / "recovered.json"))
    assert "recovered" in r.stderr and (tmp_path / "recovered.json").exists()


def test_a_steps_capture_of_a_process_that_makes_no_steps_says_to_use_duration(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    status = _ask(runtime, target.pid, {"op": "status"})
    assert status["steps"] == 0 and status["step_sources"] == []
    assert "none seen (--duration only)" in _cli(runtime, "ps").stdout
    r = _cli(runtime, "capture", str(target.pid), "--steps", "2", "--timeout", "1", "-o", str(tmp_path / "x.json"), check=False)
    assert r.returncode == 2 and "no step boundary came within 1 s" in r.stderr and "--duration" in r.stderr, r.stderr
    assert not (tmp_path / "x.json").exists()


def test_bad_capture_arguments_are_refused_before_anything_is_asked(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime).wait_listening()
    targets.append(target)
    for args, says in [
        (["--duration", "1", "--steps", "2"], "exactly one of --duration"),
        (["--duration", "-1"], "positive number"),
        (["--duration", "1", "-o", str(tmp_path / "no" / "such.json")], "does not exist"),
        (["--duration", "1", "--activities", "nosuchdevice"], "unknown activity 'NOSUCHDEVICE'"),
    ]:
        r = _cli(runtime, "capture", str(target.pid), *args, check=False)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)
    r = _cli(runtime, "capture", "999999", "--duration", "1", check=False)
    assert r.returncode == 2 and "is not capturable" in r.stderr and "POLYPROF_ON_DEMAND=1" in r.stderr
    assert _ask(runtime, target.pid, {"op": "status"})["capture"] is None


def test_polyprof_run_on_demand_and_listen_make_a_process_capturable(tmp_path, runtime, targets):
    target = Target(tmp_path, runtime, on_demand="0", command=[sys.executable, "-m", "polyprof", "run", "--on-demand"])
    targets.append(target)
    target.wait_listening()
    _cli(runtime, "capture", str(target.pid), "--duration", "0.3", "-o", str(tmp_path / "run.json"), "--no-summary")
    assert (tmp_path / "run.json").exists()
    code, err = target.finish()
    assert code == 0, err


def test_a_forked_child_neither_listens_nor_removes_the_parents_socket(tmp_path, runtime):
    script = textwrap.dedent("""
        import os, sys, polyprof
        path = polyprof.listen()
        pid = os.fork()
        if pid == 0:
            from polyprof.ondemand.listener import listener
            print("child listening:", listener().listening, flush=True)
            sys.exit(0)  # runs atexit: must not unlink the parent's socket
        os.waitpid(pid, 0)
        print("parent socket kept:", os.path.exists(path), flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script], env=_env(runtime), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "child listening: False" in r.stdout and "parent socket kept: True" in r.stdout


def test_the_pth_hook_is_installed_and_does_nothing_without_the_variable(runtime):
    import site

    hooks = [os.path.join(d, "polyprof-startup.pth") for d in site.getsitepackages() if os.path.exists(os.path.join(d, "polyprof-startup.pth"))]
    assert hooks, "polyprof's installation put its .pth file in site-packages"
    r = subprocess.run([sys.executable, "-c", "import sys; print('polyprof' in sys.modules)"],
                       env={**_env(runtime), "POLYPROF_ON_DEMAND": "0"}, capture_output=True, text=True)
    assert r.stdout.strip() == "False", "without the variable, the hook imports nothing"
    assert not (runtime / "polyprof").exists()



def test_capture_all_takes_every_capturable_process_and_merges_them(tmp_path, runtime, targets):
    first, second = Target(tmp_path, runtime).wait_listening(), Target(tmp_path, runtime).wait_listening()
    targets += [first, second]
    r = _cli(runtime, "capture", "--all", "--duration", "0.5", "-o", str(tmp_path / "all.json"), "--no-summary")
    written = sorted(p.name for p in tmp_path.glob("all.pid*.json"))
    assert written == sorted(f"all.pid{t.pid}.json" for t in (first, second)), r.stderr
    merged = json.loads((tmp_path / "all.json").read_text())
    assert len(merged["ranks"]) == 2 and "merged into" in r.stderr
