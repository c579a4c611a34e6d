"""The flight recorder on a real job: 4 gloo DDP ranks under torchrun. A slow step (rank 2 sleeps), a
signal sent to rank 1 alone, and a hang (rank 1 does not enter the all-reduce for seconds, the others
wait in it) each leave a capture of the same window on every rank."""

from __future__ import annotations

import glob
import os
import re
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
            "--nproc-per-node", str(ranks), str(script), str(folder)]


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
                          timeout=240)
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
               for o in origins), [o["job"] for o in origins]
    # rank 1, sleeping when the others timed out, captured the same window on their word, within 2 s
    (answer,) = [t.metadata[FLIGHT_KEY] for t in found[1] if t.metadata[FLIGHT_KEY]["job"].get("origin_rank") in (0, 2)]
    origin = found[answer["job"]["origin_rank"]][0].metadata[FLIGHT_KEY]
    assert answer["evidence"]["backend"] == "gloo" and answer["at_epoch_s"] - origin["at_epoch_s"] < 2.0


HOSTILE = """
import os, sys, time, torch, torch.distributed as dist
import polyprof
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
recorder = polyprof.flight_recorder(seconds=8, min_gap_s=3, out_dir=os.path.join(out, "flight"), hang_s=None,
                                    slow_step=None, signals=("SIGUSR2",))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10**6):
    time.sleep(0.02)
    if step == 5:
        open(os.path.join(out, f"ready{rank}"), "w").write(f"{os.getpid()} {os.environ['MASTER_PORT']}")
    if os.path.exists(os.path.join(out, "stop")):
        break
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
dist.barrier()
recorder.wait(60)
recorder.stop()
print(f"rank {rank} skipped {recorder._job.skipped}", flush=True)
""" + DDP_TEARDOWN


@pytest.mark.parametrize("secret", [None, "s3cret"], ids=["no job secret", "POLYPROF_JOB_SECRET"])
def test_a_local_process_on_the_jobs_store_cannot_write_outside_the_folder_nor_stall_the_ranks(tmp_path, secret):
    """What anyone who reaches the store's port can write: a trigger numbered and never published, one
    that is not an object, a name that climbs out of the folder, a flood of names. The ranks skip and
    count what is malformed, write only in their own folder, capture the flood at the job's rate, and
    still capture a real signal afterwards; with a job secret, nothing the process wrote is captured."""
    from datetime import timedelta

    import orjson
    import torch.distributed as dist

    env = {**os.environ, **({"POLYPROF_JOB_SECRET": secret} if secret else {})}
    proc = subprocess.Popen(_torchrun(tmp_path, HOSTILE, 2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        time.sleep(0.3)
        pid1, port = (tmp_path / "ready1").read_text().split()
        store = dist.TCPStore("127.0.0.1", int(port), is_master=False, timeout=timedelta(seconds=10))
        n = store.add("polyprof/flight/count", 1)
        store.set(f"polyprof/flight/trigger/{n}", orjson.dumps({"trigger": "x/../../planted-dir/owned", "rank": 7,
                                                                "at_epoch_s": "soon", "evidence": [1]}))
        n = store.add("polyprof/flight/count", 1)
        store.set(f"polyprof/flight/trigger/{n}", b"[1, 2]")  # not an object
        time.sleep(1.5)  # (the ranks poll twice a second: these are looked at before what follows)
        store.add("polyprof/flight/count", 1)  # numbered, never published
        for i in range(20):  # a flood of names
            n = store.add("polyprof/flight/count", 1)
            store.set(f"polyprof/flight/trigger/{n}", orjson.dumps({"trigger": f"flood{i}", "rank": 9, "at_epoch_s": time.time()}))
        time.sleep(7)  # past the wait for the number never published
        os.kill(int(pid1), signal.SIGUSR2)
        time.sleep(3)
        (tmp_path / "stop").write_text("")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert not (tmp_path / "planted-dir").exists() and not list(tmp_path.rglob("owned*"))
    captures = sorted(p.name for p in (tmp_path / "flight").glob("flight-*-rank0-*.pftrace"))
    assert any(c.startswith("flight-signal-rank0-") for c in captures), f"rank 1's real signal, still answered: {captures}"
    skipped = int(re.search(r"rank 0 skipped (\d+)", out).group(1))  # (the ranks' lines can interleave)
    if secret:  # nothing the process without the secret wrote is captured
        assert captures == [c for c in captures if c.startswith("flight-signal-")], captures
        assert skipped >= 3 + 16, out
        return
    assert any(name.startswith("flight-x_.._.._planted-dir_owned-rank0-") for name in captures), captures
    assert len([c for c in captures if c.startswith("flight-flood")]) <= 5, "the flood is captured at the job's rate"
    assert 2 <= skipped <= 1 + 21 - 16, out  # the malformed, the unpublished, the flood beyond the 16 looked at
