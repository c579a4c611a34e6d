"""The flight recorder on a real job: 4 gloo DDP ranks under torchrun. A slow step (rank 2 sleeps), a
signal sent to rank 1 alone, and a hang (rank 1 does not enter the all-reduce for seconds, the others
wait in it) each leave a capture of the same window on every rank."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
from ddp_teardown import DDP_TEARDOWN

import polyprof
from polyprof.flight import FLIGHT_KEY

torch = pytest.importorskip("torch", reason="needs torch (CPU build) for torch.distributed")

JOB = """
import os, sys, time, torch, torch.distributed as dist
import polyprof
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
recorder = polyprof.flight_recorder(seconds=8, min_gap_s=4, out_dir=out, hang_s=2.0, signals=("SIGUSR2",))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    time.sleep(0.02)
    if rank == 2 and step == 8:
        time.sleep(1.0)                      # a slow step: everyone's step 8 is slow, waiting for rank 2
    if step == 16:
        open(os.path.join(out, f"ready{rank}"), "w").write(str(os.getpid()))
        time.sleep(1.0)                      # the test signals rank 1 alone meanwhile
    if rank == 1 and step == 28:
        time.sleep(5.0)                      # a hang: rank 1 does not enter the all-reduce
    opt.zero_grad()
    with polyprof.record_function("forward_backward"):
        model(torch.randn(8, 16)).sum().backward()
    opt.step()
recorder.wait(60)
time.sleep(1.0)                              # the others' answers come within the job thread's poll
recorder.stop()
""" + DDP_TEARDOWN


def _torchrun(folder, script_text: str, ranks: int) -> list[str]:
    """The command that runs `script_text` (given `folder` as its argument) on `ranks` ranks."""
    script = folder / "job.py"
    script.write_text(script_text)
    return [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(folder / "torchrun"), "--standalone",
            "--nproc-per-node", str(ranks), str(script), str(folder)]  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flight-job")
    proc = subprocess.Popen(_torchrun(folder, JOB, 4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder)
    deadline = time.monotonic() + 240
    ready = folder / "ready1"
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.1)
    os.kill(int(ready.read_text()), signal.SIGUSR2)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return folder


def _by_rank(folder, trigger: str) -> dict[int, list]:
    found: dict[int, list] = {}
    for path in glob.glob(str(folder / f"flight-{trigger}-rank*.pftrace")):
        trace = polyprof.load_trace(path)
        found.setdefault(trace.metadata[FLIGHT_KEY]["rank"], []).append(trace)
    return found


def _steps(trace) -> set[int]:
    return {int(a.name.split("#")[1]) for a in trace.activities if a.name.startswith("ProfilerStep#")}


def test_a_slow_step_is_captured_once_on_every_rank(job):
    found = _by_rank(job, "slow_step")
    assert sorted(found) == [0, 1, 2, 3]
    for rank, traces in found.items():
        (trace,) = [t for t in traces if t.metadata[FLIGHT_KEY]["evidence"]["step"] == 8]  # once each
        assert set(range(3, 9)) <= _steps(trace), rank


def test_a_signal_to_one_rank_is_a_capture_of_the_same_window_on_every_rank(job):
    found = _by_rank(job, "signal")
    assert sorted(found) == [0, 1, 2, 3] and all(len(v) == 1 for v in found.values())
    flights = {rank: traces[0].metadata[FLIGHT_KEY] for rank, traces in found.items()}
    assert flights[1]["evidence"] == {"signal": "SIGUSR2"} and "origin_rank" not in flights[1].get("job", {})
    for rank in (0, 2, 3):
        assert flights[rank]["job"]["origin_rank"] == 1 and flights[rank]["evidence"] == {"signal": "SIGUSR2"}
        assert flights[rank]["job"]["trigger_number"] == flights[1]["job"]["trigger_number"]
        assert flights[rank]["at_epoch_s"] - flights[1]["at_epoch_s"] < 2.0, "the others answer within a poll"
    for rank, (trace,) in found.items():
        assert set(range(10, 16)) <= _steps(trace), rank
    for rank, flight in flights.items():  # every rank says who captured the window with it
        others = sorted({0, 1, 2, 3} - {rank})
        assert sorted(int(r) for r in flight["job"]["answered"]) == others and flight["job"]["missing"] == []
        for other, path in flight["job"]["answered"].items():
            assert path.startswith(str(job / f"flight-signal-rank{other}-")), path


def test_a_rank_that_does_not_enter_the_all_reduce_is_a_hang_on_every_rank(job):
    found = _by_rank(job, "hang")
    assert sorted(found) == [0, 1, 2, 3], sorted(found)
    for rank, (trace,) in found.items():
        assert set(range(22, 28)) <= _steps(trace), rank
        flight = trace.metadata[FLIGHT_KEY]
        assert 2.0 <= flight["evidence"]["silent_s"] < 2.0 + 2.0, "within the threshold and 2 s"
        if rank != 1:
            assert "seen" not in flight["evidence"], "the waiting ranks' watchdogs ran while they waited"
        # where each rank is: the others wait inside forward_backward (DDP's all-reduce), rank 1 is not in it
        still_open = {a.name for a in trace.activities if a.args.get("finished") is False}
        assert still_open == ({"ProfilerStep#28"} if rank == 1 else {"ProfilerStep#28", "forward_backward"}), rank
    slow = _by_rank(job, "slow_step")
    assert all(len(v) == 2 for v in slow.values()), "the hang, once over, is a slow step too"
    for rank, traces in slow.items():
        (after_hang,) = [t for t in traces if t.metadata[FLIGHT_KEY]["evidence"]["step"] == 28]
        # the 8 s ring still holds the steps before the 5 s hang, however slow the machine's steps
        assert set(range(25, 29)) <= _steps(after_hang), f"rank {rank}: the steps before the slow one"


GONE_JOB = """
import os, sys, time, torch.distributed as dist
import polyprof
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
recorder = polyprof.flight_recorder(seconds=5, out_dir=out, hang_s=None, signals=())
recorder.answer_wait_s = 3.0
dist.barrier()
if rank == 2:
    os._exit(0)                              # gone without a word: it cannot answer
time.sleep(1.0)
if rank == 1:
    with polyprof.record_function("before the trigger"):
        time.sleep(0.01)
    recorder.capture("manual", {"why": "a rank is gone"})
time.sleep(1.5)                              # rank 0's job thread answers within a poll
recorder.wait(30)
recorder.stop()                              # waits for the answers to be in the captures
os._exit(0)                                  # (the group lost a rank: no teardown)
"""


def test_a_rank_that_cannot_answer_is_named_in_the_others_captures(tmp_path):
    proc = subprocess.run(_torchrun(tmp_path, GONE_JOB, 3), capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = _by_rank(tmp_path, "manual")
    assert sorted(found) == [0, 1], sorted(found)
    for rank, (trace,) in found.items():
        job = trace.metadata[FLIGHT_KEY]["job"]
        assert job["missing"] == [2], (rank, job)
        assert sorted(int(r) for r in job["answered"]) == [1 - rank]
    assert any(a.name == "before the trigger" for a in found[1][0].activities), "the capture itself is kept"
    assert not glob.glob(str(tmp_path / ".answers-*")), "no rewrite is left half-done"


TIMEOUT_JOB = """
import datetime, os, sys, time, torch, torch.distributed as dist
import polyprof
out = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
rank = dist.get_rank()
recorder = polyprof.flight_recorder(seconds=10, out_dir=out, hang_s=None, signals=())
t = torch.ones(4)
for step in range(12):
    with polyprof.record_function("step_work"):
        time.sleep(0.01)
    if rank == 1 and step == 10:
        time.sleep(4.0)                      # rank 1 is late: the others' all-reduce times out
    dist.all_reduce(t)
    recorder.step()
"""


def test_a_collective_that_times_out_is_captured_on_every_rank(tmp_path):
    proc = subprocess.run(_torchrun(tmp_path, TIMEOUT_JOB, 3), capture_output=True, text=True, cwd=tmp_path,
                          timeout=240)  # fmt: skip
    assert proc.returncode != 0, "the ranks whose all-reduce timed out fail"
    found = _by_rank(tmp_path, "collective_timeout")
    assert sorted(found) == [0, 1, 2], (sorted(found), proc.stderr[-3000:])
    origins: list[dict] = []
    for rank, traces in found.items():
        flights = [t.metadata[FLIGHT_KEY] for t in traces]
        timed_out = [f for f in flights if "origin_rank" not in f.get("job", {})]
        if rank != 1:  # its own all-reduce raised gloo's timeout
            (own,) = timed_out
            assert own["evidence"]["backend"] == "gloo" and "Timed out" in own["evidence"]["message"]
            origins.append(own)
        for trace in traces:
            assert set(range(5, 10)) <= _steps(trace), (rank, sorted(_steps(trace)))
    # a rank that timed out waits for the others' answers before it ends (its end makes torchrun stop
    # the rest, so the first to end is the one sure to have them all in its capture)
    assert any(sorted(int(r) for r in o["job"].get("answered", {})) == sorted({0, 1, 2} - {o["rank"]})
               for o in origins), [o["job"] for o in origins]  # fmt: skip
    # rank 1, sleeping when the others timed out, captured the same window on their word, within 2 s
    (answer,) = [t.metadata[FLIGHT_KEY] for t in found[1] if t.metadata[FLIGHT_KEY]["job"].get("origin_rank") in (0, 2)]
    origin = found[answer["job"]["origin_rank"]][0].metadata[FLIGHT_KEY]
    assert answer["evidence"]["backend"] == "gloo" and answer["at_epoch_s"] - origin["at_epoch_s"] < 2.0
