"""A whole torch.distributed job captured on demand: 2 ranks (gloo) under torchrun, started with
POLYPROF_ON_DEMAND=1 and no polyprof import, captured by steps through one rank; the request reaches the
other through the job's store."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddp_teardown import DDP_TEARDOWN
from test_ondemand import _ask, _cli, _env, _steps

torch = pytest.importorskip("torch", reason="needs torch (CPU build) for torch.distributed")

JOB = r"""
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
stop_file, deadline = sys.argv[1], time.time() + 150
while True:
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    flag = torch.tensor([float(os.path.exists(stop_file) or time.time() > deadline)])
    dist.all_reduce(flag)  # every rank stops at the same step
    if flag.item():
        break
    time.sleep(0.02)
""" + DDP_TEARDOWN


def _start_job(tmp_path, runtime, cwd, **env: str) -> subprocess.Popen:
    """The 2-rank job under torchrun with POLYPROF_ON_DEMAND=1; it stops when tmp_path/stop appears."""
    runtime.mkdir(mode=0o700)
    (tmp_path / "job.py").write_text(JOB)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "torchrun"), "--standalone",
           "--nproc-per-node", "2", str(tmp_path / "job.py"), str(tmp_path / "stop")]
    return subprocess.Popen(cmd, env=_env(runtime, POLYPROF_ON_DEMAND="1", **env), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stepping_ranks(job: subprocess.Popen, runtime) -> list[dict]:
    """`polyprof ps` of the job's two ranks, once both listen and have stepped."""
    deadline = time.monotonic() + 120
    ranks: list[dict] = []
    while len(ranks) < 2:
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the ranks never listened and stepped"
        found = [json.loads(line) for line in _cli(runtime, "ps", "--json").stdout.splitlines()]
        ranks = [p for p in found if p.get("distributed") and p.get("steps", 0) > 3]
        time.sleep(0.2)
    return ranks


def _plant_request(ranks: list[dict], output: Path) -> object:
    """A capture request (id "planted", 2 steps, a few steps ahead) written into the job's store as any
    local process that reaches its port can write it, unsealed; the store's client is returned."""
    from datetime import timedelta

    import orjson
    import torch.distributed as dist

    environ = open(f"/proc/{ranks[0]['pid']}/environ", "rb").read().split(b"\0")
    port = int(next(v for v in environ if v.startswith(b"MASTER_PORT=")).split(b"=", 1)[1])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    request = {"id": "planted", "start_step": max(p["steps"] for p in ranks) + 5, "steps": 2, "output": str(output),
               "timeout_s": 30, "asked_by": 0}
    store.set("polyprof/ondemand/request", orjson.dumps(request))
    return store


def test_a_two_rank_job_is_captured_as_a_whole_by_steps(tmp_path):
    runtime = tmp_path / "run"
    stop = tmp_path / "stop"
    job = _start_job(tmp_path, runtime, cwd=tmp_path)
    try:
        ranks = _stepping_ranks(job, runtime)
        assert sorted(p["rank"] for p in ranks) == [0, 1] and {p["world_size"] for p in ranks} == {2}
        asked = next(p for p in ranks if p["rank"] == 1)  # any rank can be asked
        r = _cli(runtime, "capture", str(asked["pid"]), "--job", "--steps", "3", "-o", str(tmp_path / "job.json"), timeout=180)
        assert "on all 2 ranks" in r.stderr and "merged into" in r.stderr, r.stderr
        steps = [_steps(tmp_path / f"job.rank{rank}.json") for rank in (0, 1)]
        assert steps[0] == steps[1] and len(steps[0]) == 3, steps
        merged = json.loads((tmp_path / "job.json").read_text())
        assert [x["rank"] for x in merged["ranks"]] == [0, 1]
        for rank in (0, 1):
            doc = json.loads((tmp_path / f"job.rank{rank}.json").read_text())
            assert doc["distributedInfo"]["rank"] == rank and doc["polyprofCapture"]["job"]["id"]
        assert all(_ask(runtime, p["pid"], {"op": "status"})["capture"] is None for p in ranks)
        # by duration, the window starts at the same agreed step on both ranks
        r = _cli(runtime, "capture", str(asked["pid"]), "--job", "--duration", "0.5", "-o", str(tmp_path / "d.json"), timeout=180)
        docs = [json.loads((tmp_path / f"d.rank{rank}.json").read_text()) for rank in (0, 1)]
        assert docs[0]["polyprofCapture"]["job"]["id"] == docs[1]["polyprofCapture"]["job"]["id"]
        assert docs[0]["polyprofCaptureStart"]["after_step"] == docs[1]["polyprofCaptureStart"]["after_step"]
        assert (tmp_path / "d.json").exists(), r.stderr
    finally:
        stop.touch()
        try:
            _, err = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            raise
    assert job.returncode == 0, err[-3000:]
    assert not os.listdir(runtime / "polyprof"), "every process removed its socket"


def test_a_rank_on_another_host_gets_the_request_through_the_store(tmp_path):
    """Two hosts as network namespaces (a veth pair), `torchrun --nnodes 2`, one node in each; the
    second node's processes have a socket folder of their own that the CLI does not see, as on another
    machine: asked through rank 0, rank 1 captures the same steps all the same."""
    from test_distributed import _netns_pair

    pair, why = _netns_pair(os.getpid() % 10_000 + 1)
    if pair is None:
        pytest.skip(why)
    (ns0, ns1), master, (if0, if1) = pair
    script = tmp_path / "job.py"
    script.write_text(JOB)
    stop = tmp_path / "stop"
    here, there = tmp_path / "run0", tmp_path / "run1"
    procs = []
    try:
        for folder in (here, there):
            folder.mkdir(mode=0o700)
        run = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "torchrun"),
               "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", master, "--master-port", "29614"]
        for node, ns, iface, folder in ((0, ns0, if0, here), (1, ns1, if1, there)):
            env = _env(folder, POLYPROF_ON_DEMAND="1", GLOO_SOCKET_IFNAME=iface)
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *run, "--node-rank", str(node), str(script), str(stop)],
                                          env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 120
        rank0 = None
        while rank0 is None:
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
            assert time.monotonic() < deadline, "rank 0 never listened and stepped"
            found = [json.loads(line) for line in _cli(here, "ps", "--json").stdout.splitlines()]
            rank0 = next((p for p in found if p.get("distributed") and p.get("steps", 0) > 3), None)
            time.sleep(0.2)
        assert not any(p.get("rank") == 1 for p in found), "rank 1 is out of this CLI's sight"
        r = _cli(here, "capture", str(rank0["pid"]), "--job", "--steps", "3", "-o", str(tmp_path / "hosts.json"), timeout=180)
        steps = [_steps(tmp_path / f"hosts.rank{rank}.json") for rank in (0, 1)]
        assert steps[0] == steps[1] and len(steps[0]) == 3, (steps, r.stderr)
    finally:
        stop.touch()
        errs = []
        for p in procs:
            try:
                errs.append(p.communicate(timeout=120)[1])
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in (ns0, ns1):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for e in errs]


def test_a_request_written_into_the_jobs_store_never_chooses_where_a_rank_writes(tmp_path):
    """Anyone who reaches the store's port can write the request key: its output's folder is not used
    (a rank writes in its own folder, under the file name made safe), so no file elsewhere is replaced."""
    from datetime import timedelta

    import orjson

    runtime = tmp_path / "run"
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "model.ckpt").write_bytes(b"weights")
    work = tmp_path / "work"
    work.mkdir()
    job = _start_job(tmp_path, runtime, cwd=work)
    try:
        ranks = _stepping_ranks(job, runtime)
        store = _plant_request(ranks, secret / "model.ckpt")
        done = {}
        for rank in (0, 1):
            store.wait([f"polyprof/ondemand/planted/done/{rank}"], timedelta(seconds=60))
            done[rank] = orjson.loads(store.get(f"polyprof/ondemand/planted/done/{rank}"))
        (tmp_path / "stop").write_text("")
        job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert (secret / "model.ckpt").read_bytes() == b"weights" and sorted(os.listdir(secret)) == ["model.ckpt"]
    for rank, result in done.items():
        assert result.get("ok"), result
        assert result["done"]["path"] == str(work / f"model.ckpt.rank{rank}.json.gz"), "its own folder, a safe name"


def test_with_a_job_secret_a_request_not_sealed_with_it_is_ignored_and_a_real_one_works(tmp_path):


    runtime = tmp_path / "run"
    job = _start_job(tmp_path, runtime, cwd=tmp_path, POLYPROF_JOB_SECRET="s3cret")
    try:
        ranks = _stepping_ranks(job, runtime)
        store = _plant_request(ranks, tmp_path / "planted.json")
        time.sleep(4)  # the ranks poll once a second
        assert not store.check([f"polyprof/ondemand/planted/done/{r}" for r in (0, 1)]), "a forged request was taken"
        asked = next(p for p in ranks if p["rank"] == 0)
        r = _cli(runtime, "capture", str(asked["pid"]), "--job", "--steps", "2", "-o", str(tmp_path / "real.json"), timeout=180)
        assert (tmp_path / "real.json").exists(), r.stderr
        (tmp_path / "stop").write_text("")
        job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert not list(tmp_path.glob("planted*"))
