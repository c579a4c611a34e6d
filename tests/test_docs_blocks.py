"""Every shell and Python block of README.md and docs/ runs as written (tests/docs_blocks.py says how a
block names what it needs), in the install profile its page names: the files it reads are made for real
(traces of a real gloo job under torchrun, a killed run's spill, a flight recorder's), the processes it
captures run (a 2-rank torchrun job with POLYPROF_ON_DEMAND and POLYPROF_FLIGHT_RECORDER set, as the
docs say to start one), and what cannot run here is skipped with its reason and counted."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from docs_blocks import ROOT, Check, checks

pytest.importorskip("torch", reason="needs torch (CPU build): the docs' training script is a torch job")

CHECKS, NOT_CODE = checks()

TRAIN = """\
# The docs' train.py: a small DDP model (under torchrun) with torch.profiler on a schedule.
import os, time
import torch
import torch.distributed as dist

if "WORLD_SIZE" in os.environ:
    dist.init_process_group("gloo")
if os.environ.get("TRAIN_PID_DIR"):
    with open(os.path.join(os.environ["TRAIN_PID_DIR"], f"rank{os.environ.get('RANK', 0)}.pid"), "w") as f:
        f.write(str(os.getpid()))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
if dist.is_initialized():
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 10**9 if os.environ.get("TRAIN_FOREVER") else int(os.environ.get("TRAIN_STEPS", "12"))
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
                            on_trace_ready=torch.profiler.tensorboard_trace_handler("tb")) as prof:
    for step in range(steps):
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        prof.step()
        time.sleep(0.02)
if dist.is_initialized():
    dist.destroy_process_group()
"""

SCRIPT = """\
# The docs' script.py: annotated work, any arguments.
import sys, time
import numpy as np
import polyprof

for step in range(4):
    with polyprof.record_function(f"step {step}"):
        np.linalg.svd(np.random.default_rng(step).random((120, 120)))
        time.sleep(0.01)
print("script.py", *sys.argv[1:])
"""

#: names the Python blocks use as given: a training step and a loader, as a reader's own code has them
PRELUDE = """\
try:
    import torch
    _model = torch.nn.Linear(16, 4)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    def train_step(batch):
        _optimizer.zero_grad(); _model(batch).sum().backward(); _optimizer.step()
    loader = [torch.randn(8, 16) for _ in range(6)]
except ImportError:  # an install profile without torch: the blocks there train nothing torch's
    def train_step(batch):
        sum(range(10_000))
    loader = list(range(6))
train = train_step
"""


#: runs a Python block as its own file (its `from __future__` first), the prelude's names as builtins,
#: then the test functions it defines (the conformance kit's block is one)
RUN_BLOCK = """\
import builtins, runpy
_names = {{}}
exec(compile({prelude!r}, "prelude", "exec"), _names)
for _name in ("train", "train_step", "loader"):
    setattr(builtins, _name, _names[_name])
for _name, _fn in runpy.run_path({block!r}, run_name="__main__").items():
    if _name.startswith("test_") and callable(_fn):
        _fn()
"""


def _run(args: list[str], cwd: Path, env: dict, timeout: int = 300) -> None:
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}"


def suite_env(**extra: str) -> dict:
    """The suite's environment, as a reader's shell with polyprof installed: its bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A folder with every file the docs' commands read, each made as a reader makes it."""
    ws = tmp_path_factory.mktemp("docs-workspace")
    (ws / "train.py").write_text(TRAIN)
    (ws / "script.py").write_text(SCRIPT)
    env = suite_env()
    polyprof = [sys.executable, "-m", "polyprof"]
    _run([*polyprof, "run", "--no-summary", "-o", "trace.json.gz", "script.py"], ws, env)
    _run([*polyprof, "run", "--no-summary", "-o", "trace.pftrace", "script.py"], ws, env)
    _run([*polyprof, "run", "--no-summary", "-o", "before.json.gz", "train.py"], ws, env)
    _run([*polyprof, "run", "--no-summary", "-o", "after.json.gz", "train.py"], ws, env | {"TRAIN_STEPS": "16"})
    (ws / "traces").mkdir()
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "polyprof", "run", "--no-summary",
          "-o", "traces/rank{rank}.json.gz", "train.py"], ws, env)
    for store in ("job", "before", "after"):
        _run([*polyprof, "store", "traces/", "-o", f"{store}.polyprof"], ws, env)
    _run([sys.executable, "-c", textwrap.dedent("""
        import torch
        with torch.profiler.profile() as p:
            for _ in range(20):
                torch.randn(64, 64).matmul(torch.randn(64, 64))
        p.export_chrome_trace("big.pt.trace.json")
    """)], ws, env)
    # a run killed by SIGKILL leaves its spill; a flight recorder's rank 3 killed leaves its own
    die = "import os, signal, time, torch\nt = time.time()\nwhile time.time() - t < 2.5:\n    torch.ones(64).add(1).sum()\nos.kill(os.getpid(), signal.SIGKILL)\n"
    (ws / "die.py").write_text(die)
    killed = ws / "killed"
    killed.mkdir()
    subprocess.run([*polyprof, "run", "--no-summary", "-o", "trace.json.gz", str(ws / "die.py")], cwd=killed, env=env,
                   capture_output=True, timeout=300)
    shutil.move(killed / ".trace.json.gz.spill", ws / ".trace.json.gz.spill")
    subprocess.run([sys.executable, "die.py"], cwd=ws, capture_output=True, timeout=300,
                   env=env | {"POLYPROF_FLIGHT_RECORDER": "30", "RANK": "3"})
    assert (ws / "flight" / "flight-rank3.spill").exists(), sorted(p.name for p in (ws / "flight").iterdir())
    for made in ("die.py", "killed", "tb"):
        shutil.rmtree(ws / made, ignore_errors=True) if (ws / made).is_dir() else (ws / made).unlink()
    return ws


@pytest.fixture(scope="module")
def running_job(workspace):
    """A 2-rank gloo job started as the docs say to make one capturable (POLYPROF_ON_DEMAND=1) with the
    flight recorder on (POLYPROF_FLIGHT_RECORDER=30): $PID is its rank 0."""
    folder = workspace.parent / "running-job"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    env = suite_env(POLYPROF_ON_DEMAND="1", POLYPROF_FLIGHT_RECORDER="30", TRAIN_FOREVER="1", TRAIN_PID_DIR=str(folder))
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], cwd=folder,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    pid_file = folder / "rank0.pid"
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    assert pid_file.exists(), "the job's rank 0 did not start"
    time.sleep(3)  # past its first steps: the listener and the recorder are armed at torch's import
    yield pid_file.read_text().strip()
    os.killpg(job.pid, signal.SIGTERM)
    try:
        job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)


def _environment(check: Check, install_profiles, workspace: Path, request, tmp_path: Path) -> tuple[Path, dict]:
    """(where `check` runs, its environment): a copy of the workspace, or the repository for `in=repo`."""
    if check.profile == "fresh":  # the block installs what it needs into an empty environment of its own
        venv = _fresh_venv(check, install_profiles)
        env = {**suite_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    elif check.profile != "suite":
        venv = install_profiles.venv(check.profile)
        env = {**suite_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    else:
        env = suite_env()
    if check.fixture == "repo":
        return ROOT, env
    work = tmp_path / "work"
    shutil.copytree(workspace, work)
    words = shlex.split(check.code) if check.language == "bash" else []
    for flag, value in zip(words, words[1:], strict=False):  # what the command makes is not there yet, as for a reader
        if flag in ("-o", "--output") and (work / value).exists():
            shutil.rmtree(work / value) if (work / value).is_dir() else (work / value).unlink()
    if "$PID" in check.code:
        env["PID"] = request.getfixturevalue("running_job")
    if check.fixture == "toy":
        source = next(b.code for b in __import__("docs_blocks").blocks(ROOT / "docs" / "writing-a-backend.md")
                      if "class ToyBackend" in b.code)
        (work / "polyprof_toy.py").write_text(source)
    return work, env


_fresh: dict[str, Path] = {}


def _fresh_venv(check: Check, install_profiles) -> Path:
    """One empty environment per block (its lines install into it one after the other)."""
    block = check.id.rsplit(":", 1)[0] + f":{check.fixture}"
    if block not in _fresh:
        venv = install_profiles.folder / f"fresh-{len(_fresh)}"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        _fresh[block] = venv
    return _fresh[block]


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_the_docs_block_runs_as_written(check, workspace, install_profiles, request, tmp_path):
    if check.skip:
        pytest.skip(check.skip)
    cwd, env = _environment(check, install_profiles, workspace, request, tmp_path)
    if check.language == "python":
        (tmp_path / "block.py").write_text(check.code + "\n")
        (tmp_path / "run_block.py").write_text(RUN_BLOCK.format(prelude=PRELUDE, block=str(tmp_path / "block.py")))
        env["PYTHONPATH"] = str(cwd)
        args = [str(Path(env["PATH"].split(os.pathsep)[0]) / "python"), str(tmp_path / "run_block.py")]
    else:
        args = ["bash", "-c", check.code]
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    said = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, f"{check.id} ({check.profile}, in {check.fixture}): exit {r.returncode}\n{check.code}\n{said}"
    assert "Traceback" not in r.stderr, f"{check.id}: a traceback\n{said}"


def test_every_block_is_counted(capsys):
    """N of M checks run, each skip with its reason, in the log (`-rs` shows them one by one too)."""
    skipped = [c for c in CHECKS if c.skip]
    with capsys.disabled():
        print(f"\ndocs blocks: {len(CHECKS) - len(skipped)} of {len(CHECKS)} checks run ({NOT_CODE} blocks are not "
              "code: toml, sql, text)")
        for c in skipped:
            print(f"  skipped {c.id}: {c.skip}")
    assert len(CHECKS) > 50 and all(c.skip.strip() for c in skipped)
