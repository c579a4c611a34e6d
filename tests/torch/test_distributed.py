"""torch.distributed jobs under polyprof: real processes launched by torchrun (gloo on this CPU), DDP
training, every rank's trace knowing its place."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from ddp_teardown import DDP_MODEL, DDP_TEARDOWN

from polyprof.backends.torch.clock_sync import ROUND_TRIPS

torch = pytest.importorskip("torch", reason="needs torch (CPU build) for torch.distributed")

TRAIN = """
import os, sys, time, torch, torch.distributed as dist
""" + DDP_MODEL + """

def step():
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    if rank == 2:
        time.sleep(0.05)  # the slow rank

MODE
""" + DDP_TEARDOWN

UNDER_PROFILER = """
import polyprof.profiler as pp
out = sys.argv[1]
with pp.profile(activities=[pp.ProfilerActivity.CPU], schedule=pp.schedule(wait=1, warmup=1, active=2),
                on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, "rank{rank}.json"))) as prof:
    for _ in range(5):
        step()
        prof.step()
"""


def _torchrun(tmp_path, *args, crashes_forgiven=0):
    """``crashes_forgiven``: reruns allowed when a rank dies of a signal (torch.profiler's reference
    runs only: its schedule corrupted the heap in 1 of 40 jobs here, "malloc(): unsorted double linked
    list corrupted", with no polyprof in the process)."""
    env = {**os.environ, "POLYPROF_BACKENDS": "", "OMP_NUM_THREADS": "1"}
    # --log-dir: without it torchrun makes a torchelastic_* folder in /tmp and never removes it
    cmd = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "torchrun"), "--standalone",
           "--nproc-per-node", "4", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    if r.returncode and crashes_forgiven and any(f"({sig})" in r.stderr for sig in ("SIGABRT", "SIGSEGV")):
        return _torchrun(tmp_path, *args, crashes_forgiven=crashes_forgiven - 1)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _check_ranks(paths):
    """Each rank's polyprof trace: its place in the job, DDP's all-reduce, and gloo's collectives with
    Kineto's record_param_comms args (torch writes none for gloo: polyprof's observer does)."""
    for rank, path in enumerate(paths):
        doc = json.loads(path.read_text())
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 4, "gloo"), path
        names = {e.get("name") for e in doc["traceEvents"]}
        assert "c10d::allreduce_" in names, "DDP's gradient all-reduce is recorded"
        works = [e["args"] for e in doc["traceEvents"] if e.get("name") == "gloo:all_reduce"]
        assert works and all(
            a["Collective name"] == "allreduce" and a["In msg nelems"] == a["Out msg nelems"] == 676 and a["dtype"] == "Float"
            and (a["Group size"], a["Rank"], a["Process Group Ranks"]) == (4, rank, "[0, 1, 2, 3]")
            and (a["Process Group Name"], a["Global rank start"], a["Global rank stride"]) == ("0", 0, 1)
            for a in works
        ), works[:1]  # 676: the model's parameters, in DDP's one bucket
        yield doc


@pytest.fixture(scope="module")
def ddp_traces(tmp_path_factory):
    """The same 4-rank DDP job traced by polyprof.profiler (rank{r}.json) and by torch.profiler
    (torch{r}.json), a schedule capturing steps 2 and 3."""
    folder = tmp_path_factory.mktemp("ddp")
    for which, prefix in (("polyprof.profiler", "rank"), ("torch.profiler", "torch")):
        body = UNDER_PROFILER.replace("polyprof.profiler", which).replace('"rank{rank}.json"', f'"{prefix}" + str(rank) + ".json"')
        script = folder / f"train_{prefix}.py"
        script.write_text(textwrap.dedent(TRAIN).replace("MODE", textwrap.dedent(body)))
        _torchrun(folder, str(script), str(folder), crashes_forgiven=int(prefix == "torch"))
    return folder


def test_ddp_under_polyprof_profiler_with_a_schedule_writes_one_trace_per_rank(ddp_traces):
    for doc in _check_ranks([ddp_traces / f"rank{r}.json" for r in range(4)]):
        steps = sorted(e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"], "every rank captured the same steps"


def _events(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") in ("X", "i") and e.get("cat") != "Trace" and e.get("s") != "g"]


@pytest.mark.parametrize("prefix", ["rank", "torch"])
def test_polyprof_merge_puts_every_rank_on_one_timeline(ddp_traces, tmp_path, prefix):
    """polyprof's and torch.profiler's traces of the job: 4 ranks' processes with unique pids and
    names, every event kept, every flow paired, polyprof's on rank 0's clock."""
    from test_export_perfetto import Parsed

    from polyprof.formats import load_trace

    inputs = [ddp_traces / f"{prefix}{r}.json" for r in range(4)]
    r = subprocess.run([sys.executable, "-m", "polyprof", "merge", *map(str, inputs), "-o", str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "4 ranks" in r.stderr, r.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert len(names) == len(set(names.values())) and {n.split(" · ")[0] for n in names.values()} == {f"rank {i}" for i in range(4)}
    assert len(_events(doc)) == sum(len(load_trace(p).activities) for p in inputs), "every event kept"
    flows = {}
    for e in doc["traceEvents"]:
        if e.get("ph") in ("s", "f"):
            flows.setdefault((e["cat"], e["id"]), []).append(e["ph"])
    assert flows and all(sorted(v) == ["f", "s"] for v in flows.values()), "ids unique across ranks, every flow paired"
    assert [x["rank"] for x in doc["ranks"]] == [0, 1, 2, 3]
    assert all((x["clock_offset_ns"] is not None) == (prefix == "rank") for x in doc["ranks"])
    subprocess.run([sys.executable, "-m", "polyprof", "merge", str(ddp_traces), "-o", str(tmp_path / "m.pftrace")],
                   check=True, capture_output=True, timeout=120)
    parsed = Parsed((tmp_path / "m.pftrace").read_bytes(), sequences=None)
    assert not parsed.unclosed and parsed.flow_starts == parsed.flow_ends
    assert len({t.process.pid for t in parsed.tracks.values() if t.HasField("process")}) == 8  # 4 ranks x 2 sets


@pytest.mark.skipif(__import__("polyprof._native", fromlist=["extension"]).extension is None,
                    reason="needs polyprof's C extension (the packet rewriter; built by setup.sh)")
def test_the_jobs_pftrace_ranks_merge_packet_by_packet_as_the_model_merges_them(ddp_traces, tmp_path, monkeypatch):
    """polyprof's 4 DDP ranks as .pftrace (their aten ops with args, DDP's collectives with
    record_param_comms args, flows): the packet rewriter's merge reads back as the model's merge."""
    from test_merge_packets import _merge, _read_back

    from polyprof.tools.convert import convert

    inputs = [str(tmp_path / f"rank{r}.pftrace") for r in range(4)]
    for r, path in enumerate(inputs):
        convert(ddp_traces / f"rank{r}.json", path)
    _, rewritten = _merge(inputs, tmp_path / "fast.pftrace", monkeypatch)
    assert sorted(rewritten) == sorted(inputs)
    _merge(inputs, tmp_path / "model.pftrace", monkeypatch, model=True)
    got = _read_back(tmp_path / "fast.pftrace")
    assert got == _read_back(tmp_path / "model.pftrace")
    comms = [row for row in got["rows"] if "Collective name" in row[-1]]
    assert {row[5].split(" · ")[0] for row in comms} == {f"rank {r}" for r in range(4)}, "every rank's collectives"


def test_polyprof_run_under_torchrun_fills_the_rank_into_the_output_path(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN).replace("MODE", "for _ in range(3):\n    step()\n"))
    out = tmp_path / "traces"
    out.mkdir()
    _torchrun(tmp_path, "-m", "polyprof", "run", "--activities", "cpu", "--no-summary", "-o",
              str(out / "run{rank}-of-{world_size}.json.gz"), str(script))
    import gzip

    paths = [out / f"run{r}-of-4.json.gz" for r in range(4)]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)
    for p in paths:
        p.with_suffix("").write_bytes(gzip.decompress(p.read_bytes()))
    list(_check_ranks([p.with_suffix("") for p in paths]))


def test_unknown_placeholders_are_refused_before_the_script_runs(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("open('ran', 'w').close()\n")
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "-o", str(tmp_path / "t{ranks}.json"), str(script)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "unknown placeholder {ranks}" in r.stderr and not (tmp_path / "ran").exists()


FAKETIME = next((p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")
                 if os.path.exists(p)), None)

CLOCK_SCRIPT = """
import os, sys, time, torch, torch.distributed as dist
import polyprof
dist.init_process_group("gloo")
rank = dist.get_rank()
with polyprof.profile(["cpu"]) as prof:
    with polyprof.record_function(f"rank {rank} work"):
        t = torch.ones(4)
        dist.all_reduce(t)
    dist.barrier()
prof.export_chrome_trace(os.path.join(sys.argv[1], f"rank{rank}.json"))
dist.destroy_process_group()
"""


def _two_ranks_with_clocks(tmp_path, shifts_s):
    """CLOCK_SCRIPT as ranks 0 and 1 of one job, rank r's wall clock moved by shifts_s[r] seconds
    (libfaketime; monotonic clocks left alone); each rank's chrome trace."""
    import socket

    script = tmp_path / "clock.py"
    script.write_text(textwrap.dedent(CLOCK_SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "POLYPROF_BACKENDS": "", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    # launched as init_process_group's env:// expects (torchrun's elastic agent keeps wall-clock
    # deadlines, which a jump on one node upsets)
    procs = []
    for rank, shift in enumerate(shifts_s):
        env = {**base, "RANK": str(rank)}
        if shift:
            env.update({"LD_PRELOAD": FAKETIME, "FAKETIME": f"{shift:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                        "FAKETIME_DONT_RESET": "1"})
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(len(shifts_s))]


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (Debian's libfaketime) to give a rank another clock")
def test_each_rank_records_its_clock_offset_to_rank_0_measured_over_the_store(tmp_path):
    """Two ranks whose wall clocks differ by 5 s (libfaketime on rank 1, its monotonic clock left alone):
    rank 1's trace records an offset of -5 s to rank 0 within the recorded uncertainty, at start and
    stop; rank 0 records itself as the reference."""
    docs = _two_ranks_with_clocks(tmp_path, (0, 5))
    clocks = [doc["polyprof"]["backends"]["torch"]["clock"]["to rank 0"] for doc in docs]
    assert clocks[0]["offset_ns"] == 0 and clocks[0]["reference"] == "rank 0"
    one = clocks[1]
    assert abs(one["offset_ns"] + 5_000_000_000) <= one["uncertainty_ns"] + 50_000_000, one
    assert one["start"]["round_trips"] == ROUND_TRIPS and "stop" in one and abs(one.get("drift_ns", 1e18)) < 100_000_000, one


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (Debian's libfaketime) to give a rank another clock")
def test_ranks_whose_profiles_start_either_side_of_midnight_utc_share_one_base(tmp_path):
    """Rank 0's clock reads half a minute before the next midnight UTC, rank 1's half a minute past
    it: both traces carry rank 0's base (the day before that midnight), so readers that ignore the
    base (HTA, Perfetto, TensorBoard) show the ranks a minute apart, not a day."""
    day = 86_400
    now = int(time.time())
    midnight = (now // day + 1) * day
    docs = _two_ranks_with_clocks(tmp_path, (midnight - 30 - now, midnight + 30 - now))
    bases = [doc["baseTimeNanoseconds"] for doc in docs]
    assert bases[0] == bases[1] == (midnight - day) * 10**9, bases
    firsts = [min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X") for doc in docs]
    assert 30e6 < firsts[1] - firsts[0] < 3_600e6, firsts  # microseconds: a minute, not a day
    clocks = [doc["polyprof"]["backends"]["torch"]["clock"]["to rank 0"] for doc in docs]
    assert clocks[0]["job_base_time_ns"] == clocks[1]["job_base_time_ns"] == bases[0], clocks


@pytest.mark.parametrize("prefix", ["rank", "torch"])
def test_the_rank_view_names_the_slow_rank_and_the_ranks_that_waited(ddp_traces, prefix):
    """Rank 2 sleeps 50 ms in every step: it is the slowest of every captured step, and the others
    wait for it in DDP's all-reduce."""
    from polyprof.analysis import rank_view

    view = rank_view([ddp_traces / f"{prefix}{r}.json" for r in range(4)])
    assert [s.step for s in view.steps] == [2, 3] and all(s.slowest == 2 for s in view.steps)
    assert view.slowest_rank == 2 and all(s.behind_ns > 30_000_000 for s in view.steps)
    by_rank = {r.rank: r for r in view.ranks}
    assert by_rank[2].waited_ns < min(by_rank[r].waited_ns for r in (0, 1, 3)), "the others waited for rank 2"
    r = subprocess.run([sys.executable, "-m", "polyprof", "summary", *[str(ddp_traces / f"{prefix}{i}.json") for i in range(4)]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "slowest rank: 2" in r.stdout, r.stderr


def _netns_pair(tag):
    """Two network namespaces joined by a veth pair (10.77.x.1 and .2), or a reason they cannot be."""
    import shutil as sh

    if os.geteuid() != 0 or sh.which("ip") is None:
        return None, "needs root and iproute2 to make two network namespaces (CI runs as root)"
    names = (f"pp{tag}a", f"pp{tag}b")
    net = 1 + tag % 250
    steps = [
        ["ip", "netns", "add", names[0]], ["ip", "netns", "add", names[1]],
        ["ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b"],
        ["ip", "link", "set", f"v{tag}a", "netns", names[0]], ["ip", "link", "set", f"v{tag}b", "netns", names[1]],
        ["ip", "-n", names[0], "addr", "add", f"10.77.{net}.1/24", "dev", f"v{tag}a"],
        ["ip", "-n", names[1], "addr", "add", f"10.77.{net}.2/24", "dev", f"v{tag}b"],
        ["ip", "-n", names[0], "link", "set", f"v{tag}a", "up"], ["ip", "-n", names[1], "link", "set", f"v{tag}b", "up"],
        ["ip", "-n", names[0], "link", "set", "lo", "up"], ["ip", "-n", names[1], "link", "set", "lo", "up"],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            for n in names:
                subprocess.run(["ip", "netns", "del", n], capture_output=True)
            return None, f"cannot make network namespaces here ({' '.join(cmd)}: {r.stderr.strip()})"
    return (names, f"10.77.{net}.1", (f"v{tag}a", f"v{tag}b")), ""


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (Debian's libfaketime) to give a host another clock")
def test_two_hosts_with_different_clocks_merge_onto_rank_0s(tmp_path):
    """Two hosts as network namespaces joined by a veth pair, `torchrun --nnodes 2` with one node in
    each, the second node's wall clock 5 s ahead (libfaketime on its worker): its trace records the
    offset, and in the merged timeline the ranks' all-reduce ends together (within the recorded
    uncertainty plus scheduling), not 5 s apart."""
    pair, why = _netns_pair(os.getpid() % 10_000)
    if pair is None:
        pytest.skip(why)
    (ns0, ns1), master, (if0, if1) = pair
    try:
        script = tmp_path / "clock.py"
        script.write_text(textwrap.dedent(CLOCK_SCRIPT))
        env = {**os.environ, "POLYPROF_BACKENDS": "", "OMP_NUM_THREADS": "1"}
        run = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "torchrun"),
               "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", master, "--master-port", "29613"]
        shifted = ["--no-python", "env", f"LD_PRELOAD={FAKETIME}", "FAKETIME=+5s", "FAKETIME_DONT_FAKE_MONOTONIC=1", sys.executable]
        procs = [
            subprocess.Popen(["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={iface}", *run, "--node-rank", str(node),
                              *extra, str(script), str(tmp_path)],
                             env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node, ns, iface, extra in ((0, ns0, if0, []), (1, ns1, if1, shifted))
        ]
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-3000:]
    finally:
        for ns in (ns0, ns1):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    one = json.loads((tmp_path / "rank1.json").read_text())["polyprof"]["backends"]["torch"]["clock"]["to rank 0"]
    assert abs(one["offset_ns"] + 5_000_000_000) <= one["uncertainty_ns"] + 50_000_000, one
    from polyprof.tools.merge_ranks import merge_traces

    merge_traces([tmp_path / "rank0.json", tmp_path / "rank1.json"], tmp_path / "merged.json")
    doc = json.loads((tmp_path / "merged.json").read_text())
    ends = {e["name"]: e["ts"] + e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).endswith(" work")}
    assert abs(ends["rank 0 work"] - ends["rank 1 work"]) < 500_000, ends  # µs: aligned, not 5 s apart


SYNCED = """
import os, time, torch, torch.distributed as dist
import polyprof
if int(os.environ["RANK"]) == 1:
    time.sleep(1.0)  # this rank reaches the rendezvous (and its first step) a second late
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(60):
    with polyprof.record_function(f"step {i}"):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    time.sleep(0.01)
""" + DDP_TEARDOWN


def test_a_duration_window_under_torchrun_starts_at_the_same_step_on_every_rank(tmp_path):
    script = tmp_path / "synced.py"
    script.write_text(textwrap.dedent(SYNCED))
    _torchrun(tmp_path, "-m", "polyprof", "run", "--activities", "cpu", "--no-summary", "--duration", "0.3",
              "-o", str(tmp_path / "r{rank}.json"), str(script))
    firsts = []
    for rank in range(4):
        doc = json.loads((tmp_path / f"r{rank}.json").read_text())
        steps = sorted(int(e["name"].split()[1]) for e in doc["traceEvents"] if str(e.get("name", "")).startswith("step "))
        assert steps, f"rank {rank} recorded steps"
        firsts.append(steps[0])
        assert doc["polyprofRun"]["started_after_optimizer_step"] == 1 and not doc["polyprofRun"]["problem"]
    assert firsts == [1, 1, 1, 1], "every rank's window starts right after optimizer step 1 (inside step 0)"


def test_a_work_spans_collective_args_take_the_group_only_where_it_is_the_jobs_one():
    from polyprof.backends.torch.distributed import collective_args

    work = {"Collective name": "allgather", "In msg nelems": 10, "dtype": "Float"}
    one = {"rank": 3, "pg_count": 1, "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [1, 3, 5, 7]}]}
    got = collective_args(work, one)
    assert (got["Out msg nelems"], got["Group size"], got["Rank"], got["Process Group Ranks"]) == (40, 4, 1, "[1, 3, 5, 7]")
    assert (got["Global rank start"], got["Global rank stride"]) == (1, 2)
    two = {**one, "pg_count": 2, "pg_config": one["pg_config"] * 2}
    assert collective_args(work, two) == work, "with subgroups a Work span does not say which group it ran on"
    nccl = {"Collective name": "allreduce", "Group size": 8}
    assert collective_args(nccl, one) == nccl, "record_param_comms' own args are kept"
    odd = collective_args({"Collective name": "all_to_all", "In msg nelems": 6}, {**one, "pg_config": [{**one["pg_config"][0], "ranks": [0, 2, 3]}]})
    assert "Out msg nelems" not in odd and "Global rank start" not in odd, "what is not known is left out"
