"""Every install profile a user can have, as pip makes it: `pip install polyprof` alone, with one extra,
with everything, with and without torch, and built without a C compiler. In each, every command of
docs/command-line.md runs on a valid and an invalid input: none prints a traceback; one that needs a
missing extra says which in one line and exits 2; everything else works.

One wheel is built per kind (with the C extension, and with the compiler failing) and installed into a
fresh virtual environment per profile, with its dependencies from the package index as a user gets them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from install_profiles import PROFILES, TORCH

SCRIPT = """\
import time
import polyprof
for i in range(3):
    with polyprof.record_function(f"work {i}"):
        time.sleep(0.01)
"""

DDP = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3)) as prof:
    for _ in range(5):
        model(torch.randn(8, 32)).sum().backward(); opt.step(); prof.step()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A folder with a script, a trace, two ranks' traces of a real gloo job, their store, and bad files."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "script.py").write_text(SCRIPT)
    (folder / "ddp.py").write_text(DDP)
    (folder / "bad.json.gz").write_text("garbage\n")
    (folder / "trunc.json").write_text('{"traceEvents": [\n')
    polyprof = [sys.executable, "-m", "polyprof"]
    subprocess.run([*polyprof, "run", "--no-summary", "-o", "trace.json.gz", "script.py"], cwd=folder, check=True,
                   capture_output=True, timeout=300)
    if TORCH is not None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "polyprof", "run",
                        "--no-summary", "-o", "traces/rank{rank}.json.gz", "ddp.py"], cwd=folder, check=True,
                       capture_output=True, timeout=300, env=env)
        subprocess.run(
            [*polyprof, "store", "traces", "-o", "job.polyprof"],
            cwd=folder,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return folder


def commands(has_torch: bool) -> list[tuple[list[str], str | None, bool]]:
    """(arguments, the extra it needs or None, whether its input is valid) for every command of
    docs/command-line.md."""
    rank_inputs = [
        (["summary", "traces/"], None, True),
        (["summary", "traces/rank0.json.gz", "traces/rank1.json.gz"], None, True),
        (["summary", "job.polyprof"], "store", True),
        (["merge", "traces/", "-o", "out/job.pftrace"], None, True),
        (["store", "traces/", "-o", "out/job.polyprof"], "store", True),
        (["sql", "job.polyprof", "select count(*) from activities"], "store", True),
        (["sql", "job.polyprof", "select nonsense from nowhere"], "store", False),
        (["diff", "job.polyprof", "job.polyprof"], "store", True),
    ]
    return [
        (["backends"], None, True),
        (["run", "-o", "out/t.json.gz", "script.py", "--its", "args"], None, True),
        (["run", "-o", "out/t.pftrace", "script.py"], None, True),
        (["run", "-o", "out/r{rank}/t.json.gz", "script.py"], None, True),
        (["run", "--activities", "cpu,nosuch", "script.py"], None, False),
        (
            [
                "run",
                "--min-span-us",
                "2",
                "--exclude",
                "aten::empty*",
                "--max-events",
                "2000000",
                "-o",
                "out/s.json",
                "script.py",
            ],
            None,
            True,
        ),
        (["run", "nosuch.py"], None, False),
        (["summary", "trace.json.gz"], None, True),
        (["summary", "--view", "steps", "trace.json.gz"], None, True),
        (["summary", "bad.json.gz"], None, False),
        (["summary", "trunc.json"], None, False),
        (["summary", "missing.json"], None, False),
        (["report", "trace.json.gz", "-o", "out/report.html"], "report", True),
        (["report", "bad.json.gz", "-o", "out/report2.html"], "report", False),
        (["diff", "trace.json.gz", "trace.json.gz"], None, True),
        (["diff", "trace.json.gz", "bad.json.gz"], None, False),
        (["recover", "missing.spill"], None, False),
        (["recover", "bad.json.gz"], None, False),
        (["convert", "trace.json.gz", "out/big.pftrace"], None, True),
        (["convert", "bad.json.gz", "out/x.pftrace"], None, False),
        (["merge", "bad.json.gz", "-o", "out/job2.pftrace"], None, False),
        (["store", "bad.json.gz", "-o", "out/job2.polyprof"], "store", False),
        (["sql", "missing.polyprof", "select 1"], "store", False),
        (["ps"], None, True),
        (["capture", "999999", "--steps", "3", "-o", "out/cap.json.gz"], None, False),
        (
            [
                "run",
                "--flight-recorder",
                "1",
                "--flight-recorder-option",
                "hang_s=120",
                "--flight-dir",
                "out/flight",
                "script.py",
            ],
            None,
            True,
        ),
        (["run", "--flight-recorder", "1", "--flight-recorder-option", "nosuch=1", "script.py"], None, False),
        *(rank_inputs if has_torch else []),
    ]


@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_command_in_every_install_profile_runs_or_names_the_missing_extra(profile, install_profiles, inputs, tmp_path):
    extras, with_c = PROFILES[profile]
    venv = install_profiles.venv(profile)
    python = venv / "bin" / "python"
    pure = subprocess.run([str(python), "-c", "import polyprof._native as n; print(n.extension is None)"],
                          capture_output=True, text=True, timeout=120)
    assert pure.stdout.strip() == str(not with_c), pure.stderr
    work = tmp_path / "work"
    shutil.copytree(inputs, work)
    (work / "out").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")} | {"COLUMNS": "200"}
    problems = []
    for args, needs, valid in commands(TORCH is not None):
        r = subprocess.run([str(venv / "bin" / "polyprof"), *args], cwd=work, capture_output=True, text=True,
                           timeout=300, env=env, stdin=subprocess.DEVNULL)
        said = (r.stdout + r.stderr).strip()
        command = "polyprof " + " ".join(args)
        if "Traceback" in said:
            problems.append(f"{command}: a traceback\n{said[-1500:]}")
        elif needs is not None and needs not in extras:
            errors = [line for line in r.stderr.splitlines() if line.startswith("polyprof: error:")]
            if r.returncode != 2 or len(errors) != 1 or f"pip install 'polyprof[{needs}]'" not in errors[0]:
                problems.append(
                    f"{command}: not one line naming the {needs} extra (exit {r.returncode})\n{said[-800:]}"
                )
        elif valid and r.returncode != 0:
            problems.append(f"{command}: exit {r.returncode}\n{said[-800:]}")
        elif not valid and (r.returncode != 2 or "polyprof: error:" not in r.stderr):
            problems.append(
                f"{command}: a bad input, exit {r.returncode} without polyprof's error line\n{said[-800:]}"
            )
    assert not problems, f"profile {profile}:\n" + "\n\n".join(problems)
