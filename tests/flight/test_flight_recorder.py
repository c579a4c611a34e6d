"""The flight recorder (polyprof.flight): always on in real processes that really slow down, hang (in
a sleep, and in C code that holds the GIL), fail and get signals; each leaves a trace of the steps
before the event that names its trigger."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

import polyprof
from polyprof import _native
from polyprof.errors import ConfigError
from polyprof.flight import FLIGHT_KEY, FlightRecorder
from polyprof.formats.spill.crash import MAGIC, read_crash
from polyprof.model import ActivityKind

pytest.importorskip("torch", reason="needs torch (the flight recorder's steps come from its optimizer)")

TRAINING = r"""
import ctypes, os, sys, time
import torch
import polyprof

mode, out = sys.argv[1], sys.argv[2]


@torch.library.custom_op("polyprof_test::sleep", mutates_args=())
def sleep_op(x: torch.Tensor, seconds: float) -> torch.Tensor:  # an operator that takes its time
    time.sleep(seconds)
    return x.clone()


if os.environ.get("POLYPROF_FLIGHT_RECORDER") is None:  # else the start-up hook started it
    polyprof.flight_recorder(seconds=5, out_dir=out, hang_s=1.0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    with polyprof.record_function("train_step"):
        model(torch.randn(16, 32)).sum().backward()
    time.sleep(0.05 if mode in ("crash", "abort", "SIGKILL") else 0.01)  # (crashes: past the first hand-overs)
    if step == 40 and mode == "slow":
        time.sleep(0.4)
    if step == 20 and mode == "hang":
        torch.ops.polyprof_test.sleep(torch.ones(1), 2.5)  # stuck inside an operator
    if step == 20 and mode == "hang_holding_the_gil":
        ctypes.PyDLL(None).usleep(2_500_000)  # C that keeps the GIL: no Python thread runs meanwhile
    if step == 30 and mode == "exception":
        raise RuntimeError("the loss is NaN")
    if step == 30 and mode == "exit":
        sys.exit(3)
    if step == 30 and mode == "crash":
        ctypes.string_at(0)  # a null pointer read: SIGSEGV
    if step == 30 and mode == "abort":
        os.abort()  # SIGABRT (as a C++ terminate, or NCCL's watchdog tearing the process down, ends)
    if step == 30 and mode in ("SIGTERM", "SIGUSR2", "SIGKILL", "on_demand"):
        open(os.path.join(out, "ready"), "w").close()
        time.sleep(1.5)
    opt.step()
    opt.zero_grad()
print("finished", flush=True)
"""


def _run(tmp_path, mode: str, env: dict | None = None, signal_at_ready: int | None = None, at_ready=None):
    out = tmp_path / "flight"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", TRAINING, mode, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    if signal_at_ready is not None:
        deadline = time.monotonic() + 120
        while not (out / "ready").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal_at_ready)
    if at_ready is not None:
        deadline = time.monotonic() + 120
        while not (out / "ready").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        at_ready(proc.pid, out)
    stdout, stderr = proc.communicate(timeout=180)
    return proc.returncode, stdout, stderr, out


def _captures(out, trigger: str) -> list[str]:
    return sorted(glob.glob(str(out / f"flight-{trigger}-*.pftrace")))


def _steps(trace) -> list[int]:
    return sorted(int(a.name.split("#")[1]) for a in trace.activities if a.name.startswith("ProfilerStep#"))


def test_a_slow_step_leaves_the_steps_before_it(tmp_path):
    code, _, stderr, out = _run(tmp_path, "slow")
    assert code == 0, stderr[-3000:]
    (path,) = _captures(out, "slow_step")
    trace = polyprof.load_trace(path)
    flight = trace.metadata[FLIGHT_KEY]
    assert flight["trigger"] == "slow_step" and flight["evidence"]["step"] == 40
    assert flight["evidence"]["step_s"] >= 0.4 > flight["evidence"]["threshold_s"]
    assert set(range(30, 41)) <= set(_steps(trace)), "the steps before the slow one are in it"
    names = {a.name for a in trace.activities}
    assert {"train_step", "aten::linear", "Optimizer.step#SGD.step"} <= names
    assert "aten::addmm" not in names, "top-level ops only (aten::linear's own are left out)"


def test_a_hang_leaves_a_trace_and_every_threads_stack(tmp_path):
    code, _, stderr, out = _run(tmp_path, "hang")
    assert code == 0, stderr[-3000:]
    (path,) = _captures(out, "hang")
    trace = polyprof.load_trace(path)
    flight = trace.metadata[FLIGHT_KEY]
    assert flight["trigger"] == "hang" and 1.0 <= flight["evidence"]["silent_s"] < 1.0 + 2.0
    assert set(range(15, 21)) <= set(_steps(trace)), "the steps done before it, and the one it is stuck in"
    (stuck,) = [a for a in trace.activities if a.name == "ProfilerStep#20"]
    assert stuck.args.get("finished") is False and stuck.end - stuck.start >= 1.0e9, "open up to the capture"
    (op,) = [a for a in trace.activities if a.name == "polyprof_test::sleep"]
    assert op.args.get("finished") is False and op.end == stuck.end, "and the operator it is stuck in"
    assert all(a.args.get("finished", True) for a in trace.activities if a.name == "ProfilerStep#19")
    stacks = open(f"{path}.stacks.txt").read()
    assert "MainThread" in stacks or "Current thread" in stacks or "Thread" in stacks
    assert "<string>" in stacks, "the training thread's frame (the script) is in it"


def test_a_hang_in_c_holding_the_gil_still_writes_the_stacks(tmp_path):
    """No Python thread runs while the training thread sleeps in C with the GIL held: faulthandler's
    timer (a C thread) writes every thread's stack at the hang threshold, and the trace comes once the
    interpreter runs again."""
    code, _, stderr, out = _run(tmp_path, "hang_holding_the_gil")
    assert code == 0, stderr[-3000:]
    (stacks,) = glob.glob(str(out / "flight-hang-*-stacks.txt"))
    text = open(stacks).read()
    assert "Thread" in text and "<string>" in text, text[-2000:]
    (path,) = _captures(out, "hang")
    assert polyprof.load_trace(path).metadata[FLIGHT_KEY]["evidence"]["silent_s"] >= 1.0


def test_an_uncaught_exception_is_captured_before_the_program_ends(tmp_path):
    code, _, stderr, out = _run(tmp_path, "exception")
    assert code == 1 and "RuntimeError: the loss is NaN" in stderr, "the failure is reported as python reports it"
    (path,) = _captures(out, "exception")
    trace = polyprof.load_trace(path)
    assert trace.metadata[FLIGHT_KEY]["evidence"]["type"] == "RuntimeError"
    assert set(range(20, 30)) <= set(_steps(trace))


def test_sys_exit_with_a_failing_status_is_captured(tmp_path):
    code, _, stderr, out = _run(tmp_path, "exit")
    assert code == 3, stderr[-3000:]
    (path,) = _captures(out, "exit")
    trace = polyprof.load_trace(path)
    assert trace.metadata[FLIGHT_KEY]["evidence"] == {"status": 3}
    assert set(range(20, 30)) <= set(_steps(trace))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR2"])
def test_a_signal_captures_then_does_what_it_did(tmp_path, sig):
    number = getattr(signal, sig)
    code, stdout, stderr, out = _run(tmp_path, sig, signal_at_ready=number)
    if sig == "SIGTERM":
        assert code == -signal.SIGTERM, stderr[-3000:]  # ended by the signal, as without the recorder
    else:
        assert code == 0 and "finished" in stdout, stderr[-3000:]
    (path,) = _captures(out, "signal")
    trace = polyprof.load_trace(path)
    assert trace.metadata[FLIGHT_KEY]["evidence"]["signal"] == sig
    assert set(range(20, 30)) <= set(_steps(trace))


def test_the_environment_starts_it_in_an_unchanged_script(tmp_path):
    env = {"POLYPROF_FLIGHT_RECORDER": "5", "POLYPROF_FLIGHT_DIR": str(tmp_path / "flight")}
    code, _, stderr, out = _run(tmp_path, "exception", env=env)
    assert code == 1, stderr[-3000:]
    assert _captures(out, "exception")


def test_polyprof_run_flight_recorder(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINING.replace("sys.argv[1], sys.argv[2]", "'slow', 'unused'"))
    run = subprocess.run([sys.executable, "-m", "polyprof", "run", "--flight-recorder", "5", "--flight-dir",
                          tmp_path / "flight", script], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and "finished" in run.stdout, run.stderr[-3000:]
    assert "flight recorder on" in run.stderr
    (path,) = _captures(tmp_path / "flight", "slow_step")
    assert polyprof.load_trace(path).metadata[FLIGHT_KEY]["evidence"]["step"] == 40


def _ops_recorded(tmp_path, ops: str) -> set[str]:
    import torch

    model = torch.nn.Linear(8, 8)
    with FlightRecorder(5, out_dir=tmp_path / ops, ops=ops, hang_s=None, signals=()) as recorder:
        for _ in range(3):
            with torch.profiler.record_function("an annotation"):  # not an op: what it holds is top-level
                model(torch.randn(2, 8))
        recorder.capture("manual", {"why": "a test"})
        assert recorder.wait(30)
    (path,) = recorder.captures
    trace = polyprof.load_trace(path)
    assert trace.metadata[FLIGHT_KEY]["evidence"] == {"why": "a test"}
    return {a.name for a in trace.activities if a.kind == polyprof.ActivityKind.CPU_OP}


def test_ops_top_all_and_none(tmp_path):
    assert {"aten::linear", "aten::addmm"} <= _ops_recorded(tmp_path, "all")
    top = _ops_recorded(tmp_path, "top")
    assert "aten::linear" in top and "aten::addmm" not in top
    assert _ops_recorded(tmp_path, "none") == set()


def test_the_ring_lets_go_of_what_is_older_than_its_seconds(tmp_path):
    import torch

    x = torch.ones(4)
    with FlightRecorder(0.5, out_dir=tmp_path, hang_s=None, signals=()) as recorder:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            x.neg()
            time.sleep(0.001)
        recorder.capture()
        assert recorder.wait(30)
    trace = polyprof.load_trace(recorder.captures[0])
    starts = [a.start for a in trace.activities if a.name == "aten::neg"]
    assert starts and (max(starts) - min(starts)) / 1e9 < 0.5 + 0.3, "only about the last half second"
    assert any("ring" in str(s.dropped).lower() for s in trace.backends.values()), "the rest was let go, counted"


@pytest.mark.parametrize("bad", [{"ops": "some"}, {"seconds": 0}, {"format": "xml"}])
def test_bad_options_are_refused_naming_them(bad):
    seconds = bad.pop("seconds", 5)
    with pytest.raises(ConfigError, match=next(iter(bad), "seconds")):
        FlightRecorder(seconds, **bad)


@pytest.mark.parametrize("how", ["crash", "abort", "SIGKILL"])
def test_a_crash_or_a_kill_leaves_the_ring_on_disk_for_recover(tmp_path, how):
    """A segmentation fault, or SIGKILL: the ring's hand-overs (every second) are on disk; ``polyprof
    recover`` reads them. A crash also leaves what was recorded since the last hand-over (written by the
    C recorder from the signal handler) and every thread's Python stack."""
    code, _, stderr, out = _run(tmp_path, how, signal_at_ready=signal.SIGKILL if how == "SIGKILL" else None)
    assert code == {"crash": -signal.SIGSEGV, "abort": -signal.SIGABRT, "SIGKILL": -signal.SIGKILL}[how], stderr[-2000:]
    (spill,) = glob.glob(str(out / "flight-pid*.spill"))
    recovered = tmp_path / "recovered.json.gz"
    run = subprocess.run([sys.executable, "-m", "polyprof", "recover", spill, "-o", recovered, "-q"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    trace = polyprof.load_trace(recovered)
    steps = set(_steps(trace))
    if how == "SIGKILL":  # nothing runs at a kill: the hand-overs (every second) are what is left
        assert set(range(3, 10)) <= steps and max(steps) < 30, sorted(steps)
        return
    (stacks,) = glob.glob(str(out / "flight-crash-pid*-stacks.txt"))
    text = open(stacks).read()
    assert ("Segmentation fault" if how == "crash" else "Aborted") in text and "<string>" in text, text[-2000:]
    if _native.extension_missing:
        return  # (the rows since the last hand-over are written at a crash by the C recorder only)
    # the C recorder wrote the rows not yet handed over at the crash: every step is there, to the one
    # the crash ended, still open then
    assert set(range(0, 31)) == steps, sorted(steps)
    (last,) = [a for a in trace.activities if a.name == "ProfilerStep#30"]
    assert last.args == {"finished": False}
    assert sum(a.name == "train_step" for a in trace.activities) == 31
    assert sum(a.name == "aten::linear" for a in trace.activities) == 2 * 31, "and the operators (top-level)"
    (last_ops,) = [[a.name for a in trace.activities if a.kind == ActivityKind.CPU_OP and last.start <= a.start]]
    assert "aten::linear" in last_ops, "the ops of the step the crash ended, written at the crash"
    crash = trace.metadata["polyprof"]["partial"]["crash"]
    assert crash["whole"] and crash["rows"] >= 1 and crash["threads"] >= 1  # (at least the open step)
    if how == "crash":  # the store streams the spill and the crash's rows as recover merges them
        from test_store_spill_stream import _assert_streams_as_recovered

        (tmp_path / "store").mkdir()
        _assert_streams_as_recovered(spill, tmp_path / "store", rows=50)
    data = open(f"{spill}.crash", "rb").read()  # a crash file cut anywhere reads what is whole before the cut
    whole = read_crash(data)
    for cut in range(len(MAGIC), len(data)):
        part = read_crash(data[:cut])
        assert not part.whole and part.rows <= whole.rows


def test_the_rings_spill_keeps_two_generations_of_about_a_ring_each(tmp_path):
    spill = tmp_path / "ring.spill"
    with polyprof.profile(["cpu"], ring_s=0.4, spill=spill, flush_interval_s=0.1) as prof:
        deadline = time.monotonic() + 2.0
        n = 0
        while time.monotonic() < deadline:
            with polyprof.record_function(f"span{n}"):
                time.sleep(0.005)
            n += 1
        assert spill.exists() and (tmp_path / "ring.spill.previous").exists()
        from polyprof.formats.spill.recover import recover_trace

        names = [a.name for a in recover_trace(str(spill)).activities if a.name.startswith("span")]
        numbers = sorted(int(x[4:]) for x in names)
        assert numbers and numbers[0] > n * 0.3, "the first spans were let go with the older generations"
        assert numbers[-1] > n * 0.8, "the spill holds the last of the ring"
        assert len(numbers) == len(set(numbers)), "each span once"
    del prof


def test_polyprof_capture_last_asks_the_running_flight_recorder(tmp_path):
    asked = {}

    def capture_last(pid, out):
        asked["run"] = subprocess.run([sys.executable, "-m", "polyprof", "capture", str(pid), "--last", "5", "-o",
                                       out / "last.pftrace", "--no-summary"], capture_output=True, text=True,
                                      timeout=120)

    code, stdout, stderr, out = _run(tmp_path, "on_demand", at_ready=capture_last)
    assert code == 0 and "finished" in stdout, stderr[-2000:]
    run = asked["run"]
    assert run.returncode == 0 and "the last 5 s" in run.stderr, run.stderr[-2000:]
    trace = polyprof.load_trace(out / "last.pftrace")
    assert trace.metadata[FLIGHT_KEY]["trigger"] == "on_demand"
    assert set(range(20, 30)) <= set(_steps(trace))


def test_capture_last_of_a_process_with_no_flight_recorder_says_so(tmp_path):
    script = "import time, polyprof; polyprof.listen(); open(__import__('sys').argv[1], 'w').close(); time.sleep(30)"
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", script, str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        run = subprocess.run([sys.executable, "-m", "polyprof", "capture", str(proc.pid), "--last", "5", "-o",
                              tmp_path / "x.pftrace"], capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and "no flight recorder runs in this process" in run.stderr, run.stderr
    finally:
        proc.kill()
        proc.wait()


FORKED_WORKER = r"""
import sys, torch, polyprof
from polyprof import annotations
from polyprof.flight.recorder import running

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 3
    def __getitem__(self, i):
        x = torch.ones(4)
        for _ in range(100_000):  # top-level ops: 2.4 MB of rows each item, were they recorded
            x = x.neg()
        rss = int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS:')))
        return torch.tensor([rss, running() is None, not annotations.recorder.active])

recorder = polyprof.flight_recorder(seconds=5, out_dir=sys.argv[1], hang_s=None, signals=())
rows = [b[0].tolist() for b in torch.utils.data.DataLoader(Items(), batch_size=1, num_workers=1)]
print(rows[-1][0] - rows[0][0], all(r[1] and r[2] for r in rows))
"""


def test_a_forked_dataloader_worker_does_not_record(tmp_path):
    """The worker's memory grows as much as with no recorder at all (its warm-up), not by the rows of
    its ops."""
    grew = {}
    for name in ("recorder", "none"):
        script = FORKED_WORKER if name == "recorder" else FORKED_WORKER.replace("polyprof.flight_recorder(", "dict(")
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                             timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]
        grew_kb, quiet = run.stdout.split()
        assert quiet == "True", "the worker's recorder let go and its recording is off"
        grew[name] = int(grew_kb)
    assert grew["recorder"] - grew["none"] < 1024, grew


@pytest.mark.parametrize("exc, backend", [
    (RuntimeError("[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv "
                  "operation to complete"), "gloo"),
    (RuntimeError("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                  "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600003 milliseconds before timing out."), "nccl"),
    (type("DistBackendError", (RuntimeError,), {})("operation timed out"), "c10d"),
    (TimeoutError("the data server read timed out"), None),
    (RuntimeError("NCCL error: unhandled system error"), None),
])
def test_a_collective_timeout_is_told_from_other_exceptions(exc, backend):
    from polyprof.flight.triggers import collective_timeout

    assert collective_timeout(type(exc), exc) == backend


def test_the_ring_keeps_under_its_megabytes(tmp_path):
    from polyprof.merge import RING_MB

    with FlightRecorder(60, out_dir=tmp_path, hang_s=None, signals=(), max_mb=0.3, crash_spill=False,
                        flush_interval_s=0.1) as recorder:
        deadline, n = time.monotonic() + 1.5, 0
        while time.monotonic() < deadline:
            with polyprof.record_function(f"span{n}"):
                n += 1
            if n % 200 == 0:
                time.sleep(0.001)  # (the hand-overs' thread gets its turn)
        recorder.capture()
        assert recorder.wait(30)
    trace = polyprof.load_trace(recorder.captures[0])
    kept = sorted(int(a.name[4:]) for a in trace.activities if a.name.startswith("span"))
    assert kept and kept[-1] > n * 0.8 and kept[0] > 0, "the newest kept, the oldest let go"
    assert len(kept) < n * 0.6 and trace.backends["host"].dropped.get(RING_MB, 0) > 0


def test_a_thread_waiting_inside_an_operator_hands_over_what_it_completed_before(tmp_path):
    """A rank waiting inside ``record_function("backward")`` (DDP's all-reduce under it) is inside an
    operator for seconds: the operators it completed before it entered are in the capture, the one it
    waits in too (unfinished)."""
    import threading

    import torch

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlightRecorder(30, out_dir=tmp_path, hang_s=None, signals=(), capturable=False, job=False) as recorder:
        for step in range(40):
            with torch.profiler.record_function("forward"):
                loss = model(torch.randn(8, 16)).sum()
            with torch.profiler.record_function("backward"):
                loss.backward()
                if step == 30:  # the capture comes while this thread waits in "backward"
                    timer = threading.Timer(1.5, lambda: recorder.capture("manual"))
                    timer.start()
                    time.sleep(3.0)
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)
        assert recorder.wait(60)
    trace = polyprof.load_trace(recorder.captures[0])
    assert sum(a.name == "forward" for a in trace.activities) == 31
    backward = [a for a in trace.activities if a.name == "backward"]
    assert len(backward) == 31 and [a.args.get("finished") for a in backward].count(False) == 1


def test_a_step_slowed_by_a_capture_being_written_is_not_a_slow_step():
    from polyprof.flight.triggers import SlowSteps

    fired = []
    slow = SlowSteps(3.0, None, lambda name, evidence: fired.append(evidence["step"]))
    now = 0.0
    for step in range(20):
        now += 0.1
        slow.step_ended(step, now)
    slow.step_ended(20, now + 1.0, excused_s=0.95)  # ten times the median, while the recorder wrote
    assert fired == []
    slow.step_ended(21, now + 1.1)
    slow.step_ended(22, now + 2.1)  # the same, with no capture under way
    slow.step_ended(23, now + 7.1, excused_s=0.2)  # a hang of 5 s that a capture overlapped a little
    assert fired == [22, 23]
