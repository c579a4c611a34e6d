"""The store and who made everyone wait, proven on a real job: 4 gloo DDP ranks under torchrun, ranks 2
and 3 on a second "host" (a network namespace) whose wall clock is 5 s ahead, with injected
stragglers: rank 2's data loading sleeps at steps 3 and 7, rank 1 runs extra matmuls at step 5."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from ddp_teardown import DDP_MODEL, DDP_TEARDOWN
from test_distributed import FAKETIME, _netns_pair

torch = pytest.importorskip("torch", reason="needs torch (CPU build) for torch.distributed")
pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")

SLEEP_S = 0.08
CLOCK_SHIFT_S = 5
JOB = """
import os, select, sys, torch, torch.distributed as dist
import polyprof.profiler as pp
""" + DDP_MODEL + """

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 8 * 16
    def __getitem__(self, i):
        if rank == 2 and i in (8 * 3, 8 * 7):  # the first item of steps 3 and 7
            select.select([], [], [], SLEEP_S)  # a sleep (time.sleep fails under libfaketime's shift)
        return torch.randn(16)

loader = torch.utils.data.DataLoader(Data(), batch_size=8)
a, b, c = torch.randn(512, 512), torch.randn(512, 512), torch.empty(512, 512)
out = sys.argv[1]
with pp.profile(activities=[pp.ProfilerActivity.CPU], schedule=pp.schedule(wait=0, warmup=1, active=14),
                on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))) as prof:
    for step, x in enumerate(loader):
        if rank == 1 and step == 5:
            for _ in range(16):
                torch.matmul(a, b, out=c)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        prof.step()
        if step == 14:
            break
""".replace("SLEEP_S", str(SLEEP_S)) + DDP_TEARDOWN


def _standalone(folder, script, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(folder / "torchrun"), "--standalone",
           "--nproc-per-node", "4", str(script), str(folder)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=folder)
    assert r.returncode == 0, r.stderr[-3000:]


def _two_hosts(folder, script, env, pair):
    (ns0, ns1), master, (if0, if1) = pair
    run = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(folder / "torchrun"), "--nnodes", "2",
           "--nproc-per-node", "2", "--master-addr", master, "--master-port", "29617"]
    shifted = ["--no-python", "env", f"LD_PRELOAD={FAKETIME}", f"FAKETIME=+{CLOCK_SHIFT_S}s",
               "FAKETIME_DONT_FAKE_MONOTONIC=1", sys.executable]
    procs = [
        subprocess.Popen(["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={iface}", *run, "--node-rank", str(node),
                          *extra, str(script), str(folder)],
                         env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node, ns, iface, extra in ((0, ns0, if0, []), (1, ns1, if1, shifted))
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(f"node {i}: {e[-2500:]}" for i, e in enumerate(errors))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The job's traces and store; `two_hosts` says whether ranks 2 and 3 ran on the shifted host."""
    folder = tmp_path_factory.mktemp("storejob")
    script = folder / "train.py"
    script.write_text(textwrap.dedent(JOB))
    env = {**os.environ, "POLYPROF_BACKENDS": "", "OMP_NUM_THREADS": "1"}
    pair, why = _netns_pair(os.getpid() % 10_000 + 1) if FAKETIME else (None, "needs libfaketime")
    if pair is None:
        _standalone(folder, script, env)
    else:
        try:
            _two_hosts(folder, script, env, pair)
        finally:
            for ns in pair[0]:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    from polyprof.store import write_store

    write_store([folder / f"rank{r}.json" for r in range(4)], folder / "job.polyprof", jobs=2)
    return {"folder": folder, "store": folder / "job.polyprof", "two_hosts": pair is not None, "why": why}


def _injected_matmul_ns(folder):
    """Rank 1's extra matmuls at step 5, as its own trace timed them."""
    doc = json.loads((folder / "rank1.json").read_text())
    step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#5")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    spans = [e for e in doc["traceEvents"] if e.get("name") == "aten::matmul" and lo <= e["ts"] < hi]
    return sum(e["dur"] for e in spans) * 1000


def test_blame_names_the_rank_step_and_cause_of_the_injected_waits(job):
    """At each injected event the others waited (at least half the injected delay each: on 2 cores the
    matmuls also slow the other ranks down), and at least 90% of the injected wait (the wait they paid
    there, up to three waiters times the delay) is named with the right rank, step and cause; no other
    rank is blamed for a long wait."""
    from polyprof import store

    with store.open(job["store"]) as s:
        blame = s.blame().to_pylist()
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    injected = {(3, 2, loader): SLEEP_S * 1e9, (7, 2, loader): SLEEP_S * 1e9,
                (5, 1, "aten::matmul"): _injected_matmul_ns(job["folder"])}
    for (step, rank, cause), delay in injected.items():
        rows = [r for r in blame if (r["step"], r["late_rank"]) == (step, rank)]
        waited = sum({(r["process_group"], r["seq"]): r["wait_ns"] for r in rows}.values())
        named = sum(r["cause_ns"] for r in rows if r["cause"] == cause)
        assert waited >= 3 * 0.5 * delay, (step, rank, waited, delay, rows)
        assert named >= 0.9 * min(waited, 3 * delay), (step, rank, cause, named, waited, delay)
    # a normal wait is 5-20 ms; the window's first step is left out (the recorders' start falls on the
    # ranks unevenly: one of them can come 30 ms late to its first all-reduce, and is blamed for it)
    late = {(r["step"], r["late_rank"]) for r in blame if r["max_wait_ns"] > 30_000_000 and r["step"] > 1}
    assert late == {(3, 2), (5, 1), (7, 2)}, late


def test_the_shifted_hosts_clock_is_within_its_recorded_uncertainty(job):
    """Ranks 2 and 3 run 5 s ahead: the job's clock puts them back within the uncertainty the store
    records for them (its pings' half round trip; the collectives' exits pin it less tightly on this
    machine, so the fit is not applied: see test_store.py for the fit where exits are tight)."""
    if not job["two_hosts"]:
        pytest.skip(job["why"])
    from polyprof import store

    with store.open(job["store"]) as s:
        clock = {r["rank"]: r for r in s.analysis("clock").to_pylist()}
    for rank in (2, 3):
        r = clock[rank]
        error = r["recorded_offset_ns"] + r["applied_correction_ns"] + CLOCK_SHIFT_S * 10**9
        bound = r["recorded_uncertainty_ns"] if not r["applied_correction_ns"] else r["fitted_uncertainty_ns"]
        assert abs(error) <= bound, r
    assert abs(clock[1]["recorded_offset_ns"] + clock[1]["applied_correction_ns"]) <= 1_000_000, clock[1]


def test_summary_of_the_store_names_who_made_everyone_wait(job):
    r = subprocess.run([sys.executable, "-m", "polyprof", "summary", str(job["store"])], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "who made everyone wait" in r.stdout and "enumerate(DataLoader)" in r.stdout and "aten::matmul" in r.stdout


def test_the_traces_in_memory_give_the_stores_blame_and_the_summary_and_report_show_it(job, tmp_path):
    from polyprof import store
    from polyprof.store import blame

    traces = [job["folder"] / f"rank{r}.json" for r in range(4)]
    in_memory = blame(traces)
    with store.open(job["store"]) as s:
        on_disk = s.blame()
    assert in_memory.columns == tuple(on_disk.column_names)
    assert sorted(in_memory.rows, key=str) == sorted((tuple(r.values()) for r in on_disk.to_pylist()), key=str)
    r = subprocess.run([sys.executable, "-m", "polyprof", "summary", *map(str, traces)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "who made everyone wait" in r.stdout and "aten::matmul" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "polyprof", "report", *map(str, traces), "-o", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    page = (tmp_path / "r.html").read_text()
    assert r.returncode == 0 and 'id="blame"' in page and "enumerate(DataLoader)" in page, r.stderr


PYTHON_JOB = """
import time, torch, torch.distributed as dist
""" + DDP_MODEL + """

def shuffle_shards(step):  # no annotation: only the Python tracer sees it
    deadline = time.perf_counter() + (0.15 if rank == 2 and step in (3, 6) else 0.0)
    while time.perf_counter() < deadline:
        pass

for step in range(10):
    shuffle_shards(step)
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
""" + DDP_TEARDOWN


def test_blame_names_an_unannotated_python_function_under_torchrun(tmp_path):
    """The user's path: torchrun, `polyprof run --activities cpu,python` (steps: the script's optimizer
    steps), `polyprof store`, `polyprof summary`; rank 2 is slow in a plain Python function at steps 3
    and 6, and blame names it there."""
    (tmp_path / "train.py").write_text(PYTHON_JOB)
    env = {**os.environ, "POLYPROF_BACKENDS": "", "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "torchrun"), "--standalone",
           "--nproc-per-node", "4", "-m", "polyprof", "run", "--no-summary", "--activities", "cpu,python",
           "-o", "traces/rank{rank}.json.gz", "train.py"]
    r = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    cli = [sys.executable, "-m", "polyprof"]
    r = subprocess.run([*cli, "store", "-q", "traces", "-o", "job.polyprof"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([*cli, "summary", "job.polyprof"], capture_output=True, text=True, cwd=tmp_path,
                       env={**env, "COLUMNS": "250"})
    assert r.returncode == 0 and "shuffle_shards" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    from polyprof import store

    with store.open(tmp_path / "job.polyprof") as job:
        steps = job.table("select rank, count(*) as n from step_spans group by rank order by rank").to_pylist()
        blame = job.blame().to_pylist()
    assert [s["n"] for s in steps] == [10] * 4, steps  # ProfilerStep#1..10, from the optimizer's steps
    for step in (3, 6):
        rows = [b for b in blame if b["step"] == step and b["late_rank"] == 2]
        named = sum(b["cause_ns"] for b in rows if b["cause"].endswith(": shuffle_shards"))
        waited = sum({(b["process_group"], b["seq"]): b["wait_ns"] for b in rows}.values())
        assert named >= 0.9 * min(waited, 3 * 0.15e9) and waited >= 3 * 0.5 * 0.15e9, (step, named, waited, rows)
    # DDP's construction comes before the first step: set-up, and only that is
    assert any(b["setup"] for b in blame) and all(b["setup"] == (b["step"] < 0) for b in blame), blame
