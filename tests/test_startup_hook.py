"""The start-up hook and the flight recorder as users switch them on: the variables in real processes
(``python``, ``pip``, ``torchrun``), torch's import slowed as a cluster's file system slows it, at the
defaults. Nothing here imports polyprof in the programs under test: the installed ``.pth`` file does."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import _polyprof_startup as variables
import polyprof
from polyprof.flight import FLIGHT_KEY

VARIABLES = {"POLYPROF_ON_DEMAND": "1", "POLYPROF_TORCH_PROFILER": "1", "POLYPROF_ACTIVITIES": "+cpu",
             "POLYPROF_FLIGHT_RECORDER": "30"}

#: a sitecustomize that makes torch's import take a second longer, where its C extension is looked up
SLOW_TORCH_IMPORT = """
import sys, time
class _Slow:
    def find_spec(self, name, path, target=None):
        if name == "torch._C":
            time.sleep(1.0)
        return None
sys.meta_path.insert(0, _Slow())
"""

PROBE = """
import sys, threading
print(sorted(t.name for t in threading.enumerate()), "polyprof" in sys.modules, flush=True)
"""


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    return {**env, "XDG_RUNTIME_DIR": str(_runtime(tmp_path)), "OMP_NUM_THREADS": "1", **extra}


def _runtime(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _slow_torch(tmp_path) -> str:
    folder = tmp_path / "slow-site"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(SLOW_TORCH_IMPORT)
    return str(folder)


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_a_process_that_never_imports_torch_is_left_as_it_was(tmp_path, name):
    """`python -c`: no thread, no polyprof import, no folder, whichever variable is set."""
    r = subprocess.run([sys.executable, "-c", PROBE], env=_env(tmp_path, **{name: VARIABLES[name]}), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == "['MainThread'] False"
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_pip_is_left_alone_with_every_variable_set_even_a_bad_one(tmp_path):
    env = _env(tmp_path, **{**VARIABLES, "POLYPROF_ACTIVITIES": "+no_such_group"})
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "polyprof" not in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["run"]
    pip = os.path.join(os.path.dirname(sys.executable), "pip")
    if os.path.exists(pip):
        r = subprocess.run([pip, "--version"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "polyprof" not in r.stderr, r.stderr


@pytest.mark.parametrize(("argv", "orig", "name", "users"), [
    (["/venv/bin/pip", "install", "x"], None, "pip", False),
    (["/venv/bin/pip3.11", "list"], None, "pip3.11", False),
    (["-m", "install"], ["python", "-m", "pip", "install"], "pip", False),
    (["/venv/bin/torchrun", "train.py"], None, "torchrun", False),
    (["-m"], ["python", "-u", "-m", "torch.distributed.run", "train.py"], "torch.distributed.run", False),
    (["/x/_in_process.py", "build_wheel"], None, "_in_process", False),
    (["train.py", "--lr", "1"], None, "train", True),
    (["-m"], ["python", "-m", "polyprof", "run", "train.py"], "polyprof", True),
    (["-c"], ["python", "-c", "pass"], "-c", True),
    (["pipeline.py"], None, "pipeline", True),
])
def test_what_is_the_users_program(argv, orig, name, users):
    assert variables.program_name(argv, orig or ["python", *argv]) == name
    assert variables.users_program(name, {}) is users
    assert not variables.users_program(name, {"POLYPROF_STARTUP_SKIP": f"other,{name}"})
    assert not variables.users_program(name, {"POLYPROF_STARTUP_SKIP": "*"})


def test_a_bad_value_is_one_warning_line_and_the_program_runs(tmp_path):
    for name, value in (("POLYPROF_FLIGHT_RECORDER", "30,hang=2"), ("POLYPROF_TORCH_PROFILER", "maybe")):
        r = subprocess.run([sys.executable, "-c", "print('ran')"], env=_env(tmp_path, **{name: value}),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout == "ran\n"
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"polyprof: {name}=") and "ignored in this process" in line, line


@pytest.mark.parametrize(("text", "settings"), [
    ("0", None), ("off", None), ("", None), ("on", {}), ("30", {"seconds": 30.0}),
    ("30,hang_s=120,slow_step=off", {"seconds": 30.0, "hang_s": 120.0, "slow_step": None}),
    ("12.5, max_captures=3, max_captures_mb=50, ops=all, job=off",
     {"seconds": 12.5, "max_captures": 3, "max_captures_mb": 50.0, "ops": "all", "job": False}),
])
def test_the_flight_recorders_settings_from_the_variable(text, settings):
    assert variables.flight_settings(text) == settings


@pytest.mark.parametrize("text", ["abc", "-3", "30,hang=1", "30,hang_s=-1", "30,max_captures=0", "30,ops=some",
                                  "30,job=perhaps", "inf", "30,hang_s"])
def test_bad_flight_recorder_settings_say_what_is_wrong(text):
    with pytest.raises(variables.BadSetting, match="POLYPROF_FLIGHT_RECORDER"):
        variables.flight_settings(text)


@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("ON", True), ("0", False), ("false", False),
                                           ("off", False), ("no", False), (" ", False)])
def test_yes_no_variables(value, on):
    assert variables.flag("X", {"X": value}) is on


torch = pytest.importorskip("torch", reason="needs torch (the hook arms at its import)")


def test_a_bad_value_is_said_once_when_torch_arms_the_rest(tmp_path):
    """A bad flight recorder value beside a good on-demand one: one line at start, none again when
    torch's import arms the listener, and a program that ends at once ends cleanly."""
    env = _env(tmp_path, POLYPROF_FLIGHT_RECORDER="abc", POLYPROF_ON_DEMAND="1")
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", "import torch"], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0
        (line,) = r.stderr.splitlines()
        assert line.startswith("polyprof: POLYPROF_FLIGHT_RECORDER='abc'"), r.stderr

TRAIN = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                                      torch.nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mode = sys.argv[1]
for step in range(int(os.environ.get("STEPS", "40"))):
    time.sleep(0.02)
    opt.zero_grad()
    with torch.profiler.record_function("forward"):
        loss = model(torch.randn(8, 16)).sum()
    if step == 30 and rank == 1 and mode == "exception":
        raise RuntimeError("the loss is NaN")
    if step == 30 and rank == 1 and mode == "hold":
        open(os.path.join(sys.argv[2], "holding"), "w").close()
        time.sleep(300)  # rank 0 waits inside the all-reduce meanwhile, in C
    with torch.profiler.record_function("backward"):
        loss.backward()
    opt.step()
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"trained{rank}"), "w").close()
dist.destroy_process_group()
"""


def _torchrun(tmp_path, ranks: int, mode: str, env: dict) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(script), mode, str(tmp_path / "flight")]
    return subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _flight_files(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path / "flight")) if (tmp_path / "flight").exists() else []


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_flight_recorder_variable_under_torchrun_with_a_slow_torch_import(tmp_path, ranks):
    """The documented way: every rank starts and trains (the recorder waits for torch's import), the
    launcher records nothing, and a clean end leaves no file."""
    env = _env(tmp_path, POLYPROF_FLIGHT_RECORDER="30", PYTHONPATH=_slow_torch(tmp_path))
    proc = _torchrun(tmp_path, ranks, "train", env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    assert sorted(p.name for p in tmp_path.glob("trained*")) == [f"trained{r}" for r in range(ranks)]
    assert "polyprof" not in err, err[-4000:]
    assert _flight_files(tmp_path) == [], "a clean end removes the spill; the launcher writes nothing"


def test_one_failure_is_one_capture_per_rank_and_leaves_no_other_file(tmp_path):
    env = _env(tmp_path, POLYPROF_FLIGHT_RECORDER="30", PYTHONPATH=_slow_torch(tmp_path))
    proc = _torchrun(tmp_path, 3, "exception", env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "the loss is NaN" in err
    files = _flight_files(tmp_path)
    assert len(files) == 3 and all(f.startswith("flight-exception-rank") for f in files), files
    traces = {polyprof.load_trace(str(tmp_path / "flight" / f)).metadata[FLIGHT_KEY]["rank"]: f for f in files}
    assert sorted(traces) == [0, 1, 2]
    for name in files:
        job = polyprof.load_trace(str(tmp_path / "flight" / name)).metadata[FLIGHT_KEY]["job"]
        assert job["missing"] == [] and all(job["answered"].values()), (name, job)


def test_sigterm_to_a_rank_blocked_in_a_collective_leaves_its_window(tmp_path):
    """Rank 0 waits inside the all-reduce (in C: its Python handler cannot run) while rank 1 sleeps;
    SIGTERM to rank 0: its window is written by the recorder's signal thread, and it ends by SIGTERM."""
    env = _env(tmp_path, POLYPROF_FLIGHT_RECORDER="30", STEPS="1000")
    (tmp_path / "flight").mkdir()
    proc = _torchrun(tmp_path, 2, "hold", env)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "flight" / "holding").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        time.sleep(1.0)
        rank0 = _rank_pid(proc.pid, 0)
        os.kill(rank0, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not glob.glob(str(tmp_path / "flight" / "flight-signal-rank0-*.pftrace")) and time.monotonic() < deadline:
            time.sleep(0.2)
        (path,) = glob.glob(str(tmp_path / "flight" / "flight-signal-rank0-*.pftrace"))
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    flight = polyprof.load_trace(path).metadata[FLIGHT_KEY]
    assert flight["evidence"]["signal"] == "SIGTERM" and "signal thread" in flight["evidence"]["main_thread"]
    steps = [a for a in polyprof.load_trace(path).activities if a.name.startswith("ProfilerStep#")]
    assert len(steps) >= 30


def _rank_pid(launcher: int, rank: int) -> int:
    """The pid of `rank` among the launcher's children (RANK in its environment)."""
    import psutil

    for child in psutil.Process(launcher).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no rank {rank} under {launcher}")


CRASH = """
import ctypes, time, torch
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    model(torch.randn(16, 32)).sum().backward()
    time.sleep(0.05)
    if step == 30:
        ctypes.string_at(0)  # SIGSEGV
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("how", ["polyprof run --flight-recorder", "POLYPROF_FLIGHT_RECORDER"])
def test_a_segfault_keeps_the_operators_of_its_last_second(tmp_path, how):
    """The recorder starts before the script imports torch: the crash writer takes torch's operator
    observer when it loads, so the crash writes the operators since the last hand-over too."""
    from polyprof import _native

    if _native.extension_missing:
        pytest.skip("needs the C extension (the crash writer)")
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    flight = tmp_path / "flight"
    if how.startswith("polyprof run"):
        command, env = [sys.executable, "-m", "polyprof", "run", "--flight-recorder", "5", "--flight-dir", str(flight),
                        str(script)], _env(tmp_path)
    else:
        command, env = [sys.executable, str(script)], _env(tmp_path, POLYPROF_FLIGHT_RECORDER="5", POLYPROF_FLIGHT_DIR=str(flight))
    r = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == -signal.SIGSEGV, r.stderr[-3000:]
    (spill,) = glob.glob(str(flight / "flight-pid*.spill"))
    recovered = tmp_path / "recovered.json.gz"
    run = subprocess.run([sys.executable, "-m", "polyprof", "recover", spill, "-o", recovered, "-q"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    trace = polyprof.load_trace(recovered)
    steps = sorted(int(a.name.split("#")[1]) for a in trace.activities if a.name.startswith("ProfilerStep#"))
    assert steps == list(range(31))
    (last,) = [a for a in trace.activities if a.name == "ProfilerStep#30"]
    assert any(a.name == "aten::linear" and a.start >= last.start for a in trace.activities), "the last step's ops"
    assert sum(a.name == "aten::linear" for a in trace.activities) == 2 * 31
    # what a crash leaves: the spill, the rows written at the crash, the stacks; no empty file
    kinds = sorted(re.sub(r"pid\d+", "WHO", name) for name in os.listdir(flight))
    assert kinds == ["flight-WHO.spill", "flight-WHO.spill.crash", "flight-crash-WHO-stacks.txt"], kinds
    assert all(os.path.getsize(flight / name) > 0 for name in os.listdir(flight))


def test_captures_beyond_the_cap_are_removed_oldest_first(tmp_path):
    recorder = polyprof.flight_recorder(seconds=2, out_dir=tmp_path, hang_s=None, signals=(), max_captures=2,
                                        crash_spill=False, capturable=False, job=False)
    try:
        mine = recorder.capture_to(str(tmp_path / "elsewhere" / "mine.pftrace"), 2.0)  # (capture --last -o)
        written = []
        for n in range(4):
            recorder.capture("manual", {"n": n})
            assert recorder.wait(60)
            written.append(recorder.captures[-1])
            time.sleep(0.002)  # (names carry milliseconds)
    finally:
        recorder.stop()
    assert recorder.captures == [mine, *written[-2:]] and os.path.exists(mine), "a file asked for is not capped"
    assert sorted(glob.glob(str(tmp_path / "flight-manual-*"))) == sorted(written[-2:])
    tiny = polyprof.flight_recorder(seconds=2, out_dir=tmp_path / "mb", hang_s=None, signals=(), max_captures_mb=1e-6,
                                    crash_spill=False, capturable=False, job=False)
    try:
        for _ in range(2):
            tiny.capture("manual")
            assert tiny.wait(60)
    finally:
        tiny.stop()
    assert len(os.listdir(tmp_path / "mb")) == 1, "the newest is kept, even over the megabytes"


RSS_LOOP = """
import sys, time, torch
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
opt = torch.optim.AdamW(model.parameters())
start, marks = time.monotonic(), {}
while time.monotonic() - start < 75:
    opt.zero_grad()
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
    for mark in (25, 75):
        if mark not in marks and time.monotonic() - start >= mark - 0.5:
            marks[mark] = rss_mb()
print(marks[25], marks[75])
"""


def test_the_recorders_memory_stays_flat_as_its_ring_wraps_again_and_again(tmp_path):
    """The variable at its defaults but a 2 s ring: 75 s of training wrap it over 30 times (the
    spill's generations rotate as often); RSS at the end is within 10% of RSS at 25 s."""
    env = _env(tmp_path, POLYPROF_FLIGHT_RECORDER="2", POLYPROF_FLIGHT_DIR=str(tmp_path / "flight"))
    r = subprocess.run([sys.executable, "-c", RSS_LOOP], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    early, late = map(float, r.stdout.split())
    assert late <= early * 1.10, (early, late)


def test_polyprof_run_takes_the_recorders_settings_and_refuses_a_bad_one_before_the_script(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os; print(os.environ['POLYPROF_FLIGHT_RECORDER'])\n")
    run = [sys.executable, "-m", "polyprof", "run", "--flight-dir", str(tmp_path / "flight")]
    r = subprocess.run([*run, "--flight-recorder", "5", "--flight-recorder-option", "hang_s=off",
                        "--flight-recorder-option", "max_captures=3", str(script)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == "5.0,hang_s=off,max_captures=3\n", "what the script starts gets the same settings"
    r = subprocess.run([*run, "--flight-recorder", "5", "--flight-recorder-option", "hang=1", str(script)],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and "'hang=1' is not NAME=VALUE" in r.stderr
    r = subprocess.run([*run, "--flight-recorder-option", "hang_s=1", str(script)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "needs --flight-recorder" in r.stderr
