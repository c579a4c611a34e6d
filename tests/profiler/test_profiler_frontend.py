"""polyprof.profiler as a drop-in for torch.profiler (issue #4), on the CPU build of torch."""

import json
import os
import re
import subprocess
import sys
import warnings
from collections import Counter

import pytest

import polyprof
from polyprof.model import ActivityKind

torch = pytest.importorskip("torch", reason="needs torch (CPU build) to compare with torch.profiler")
nn = torch.nn


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 16)


def train_steps(model, inputs, steps, prof=None, record_function=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        ctx = record_function("model_step") if record_function else _null()
        with ctx:
            opt.zero_grad()
            loss = model(inputs).pow(2).mean()
            loss.backward()
            opt.step()
        if prof is not None:
            prof.step()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_standard_torch_profiler_usage_runs_with_only_the_import_changed(tmp_path):
    from polyprof.profiler import (
        ProfilerActivity,
        profile,
        record_function,
        schedule,
        tensorboard_trace_handler,
    )

    model, inputs = make_model()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(tmp_path / "tb")),
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    ) as prof:
        for _ in range(6):
            with record_function("model_inference"):
                model(inputs)
            prof.step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    assert "Self CPU %" in table and "# of Calls" in table
    rows = [line for line in table.splitlines() if "%" in line and "Self CPU %" not in line]
    assert len(rows) == 10
    # with with_stack, Python frames are rows of torch.profiler's table too: every op is among all rows
    assert "aten::linear" in prof.key_averages().table(row_limit=-1)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    prof.export_chrome_trace(str(tmp_path / "trace.json.gz"))
    (written,) = os.listdir(tmp_path / "tb")
    assert re.fullmatch(rf"{re.escape(os.uname().nodename)}_{os.getpid()}\.\d+\.pt\.trace\.json", written)
    doc = json.loads((tmp_path / "trace.json").read_text())
    steps = sorted(e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    linear = next(e for e in doc["traceEvents"] if e.get("name") == "aten::linear")
    assert linear["cat"] == "cpu_op" and linear["args"]["Input Dims"] and "External id" in linear["args"]
    assert any(e.get("name") == "[memory]" and "Bytes" in e["args"] for e in doc["traceEvents"])
    assert prof.step_num == 6


def cpu_op_names_polyprof(trace):
    return Counter(a.name for a in trace.activities_of(ActivityKind.CPU_OP))


def test_same_operators_and_call_counts_as_torch_profiler(tmp_path):
    from torch.profiler import ProfilerActivity as TA
    from torch.profiler import profile as torch_profile

    from polyprof.profiler import ProfilerActivity, profile
    from polyprof.profiler.averages import UTILITY_NAMES, native_key_averages

    model, inputs = make_model()
    train_steps(model, inputs, 2)  # warm up lazy initialisation outside both profiles
    with torch_profile(activities=[TA.CPU]) as theirs:
        train_steps(model, inputs, 3)
    with profile(activities=[ProfilerActivity.CPU]) as ours:
        train_steps(model, inputs, 3)
    # the traces: torch's JSON and polyprof's trace hold the same operators, as many times each
    theirs.export_chrome_trace(str(tmp_path / "torch.json"))
    their_trace = json.loads((tmp_path / "torch.json").read_text())["traceEvents"]
    their_ops = Counter(
        e["name"] for e in their_trace if e.get("cat") == "cpu_op" and e["name"] not in UTILITY_NAMES
    )
    our_ops = Counter(n for n in cpu_op_names_polyprof(ours.trace).elements() if n not in UTILITY_NAMES)
    assert our_ops == their_ops and sum(our_ops.values()) > 50
    # the tables: key_averages counts per operator, through torch's EventList and polyprof's own
    their_counts = {e.key: e.count for e in theirs.key_averages() if e.key in their_ops}
    assert {e.key: e.count for e in ours.key_averages() if e.key in our_ops} == their_counts
    assert {e.key: e.count for e in native_key_averages(ours.trace) if e.key in our_ops} == their_counts


SCHEDULES = [
    dict(wait=1, warmup=1, active=2, repeat=1),
    dict(wait=0, warmup=1, active=1, repeat=3),
    dict(wait=2, warmup=1, active=3, repeat=2, skip_first=2),
    dict(wait=1, warmup=2, active=1, repeat=0),
]


@pytest.mark.parametrize("kw", SCHEDULES)
def test_schedule_matches_torchs_step_for_step(kw):
    from torch.profiler import schedule as torch_schedule

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = polyprof.schedule(**kw), torch_schedule(**kw)
    assert [ours(i).name for i in range(40)] == [theirs(i).name for i in range(40)]


@pytest.mark.parametrize("kw", SCHEDULES[:3])
def test_step_numbering_and_saved_cycles_match_torch(kw):
    from torch.profiler import ProfilerActivity as TA
    from torch.profiler import profile as torch_profile
    from torch.profiler import schedule as torch_schedule

    from polyprof.profiler import ProfilerActivity, profile, schedule

    steps = 12
    model, inputs = make_model()

    def run(profile_cls, sched, activity, names_of):
        cycles = []

        def ready(p):
            cycles.append((p.step_num, sorted(n for n in names_of(p) if n.startswith("ProfilerStep#"))))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profile_cls(activities=[activity], schedule=sched(**kw), on_trace_ready=ready) as p:
                train_steps(model, inputs, steps, prof=p)
        return cycles

    theirs = run(torch_profile, torch_schedule, TA.CPU, lambda p: [e.trace_name for e in p.events()])
    ours = run(profile, schedule, ProfilerActivity.CPU, lambda p: [a.name for a in p.trace.activities])
    assert ours == theirs and theirs


def test_device_time_columns_and_cuda_sort_key_alias():
    """self_cuda_time_total sorts by device time, whichever device ran the work."""
    from fake_backends import SimDeviceBackend

    from polyprof.engine.registry import Registry
    from polyprof.profiler.averages import native_key_averages

    reg = Registry(use_env=False)
    sim = SimDeviceBackend()
    reg.register(sim)
    with polyprof.profile(["cpu", "simdev"], registry=reg) as prof:
        with polyprof.record_function("launcher"):
            sim.launch("k1")
            sim.launch("k2")
        with polyprof.record_function("idle"):
            pass
    avgs = native_key_averages(prof.trace)
    table = avgs.table(sort_by="self_cuda_time_total")
    assert "Self SIM" in table and "SIM total" in table
    first_row = table.splitlines()[3]
    assert first_row.startswith("launcher")
    top = avgs.table(top_level_events_only=True)
    assert "launcher" in top and "idle" in top
    launcher = next(a for a in avgs if a.key == "launcher")
    assert launcher.self_device_time_total == pytest.approx(
        1.0
    ) and launcher.self_cuda_time_total == pytest.approx(1.0)


def test_torch_only_options_without_torch_are_a_clear_error(monkeypatch):
    import polyprof.profiler.frontend as front

    monkeypatch.setattr(front, "torch_installed", lambda: False)
    with pytest.raises(
        polyprof.ConfigError, match="record_shapes, with_flops describe PyTorch operators and need torch"
    ):
        front.profile(activities=["cpu"], record_shapes=True, with_flops=True)
    front.profile(activities=["cpu"])  # without those options it works


def test_torch_backend_says_why_when_torch_is_missing(monkeypatch):
    import importlib.util

    from polyprof.backends.torch.backend import backend as torch_backend

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    avail = torch_backend.probe()
    assert not avail.available and "torch is not installed" in avail.reason


def test_polyprof_run_records_the_ops_of_a_script_that_imports_torch_later(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.ones(4, 4)\ny = (x @ x).sum()\nprint('done', float(y))\n")
    out = tmp_path / "t.json"
    r = subprocess.run(
        [sys.executable, "-m", "polyprof", "run", "--no-summary", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    names = {e.get("name") for e in json.loads(out.read_text())["traceEvents"]}
    assert "aten::matmul" in names and "aten::sum" in names


def test_run_duration_stops_torch_on_the_main_thread(tmp_path):
    """torch's collector must be stopped on the thread that started it; --duration does that. torch is
    imported before the profile starts (sitecustomize), so the test does not depend on import time."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import torch\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "x = torch.ones(32, 32)\n"
        "t0 = time.monotonic()\n"
        "while time.monotonic() - t0 < 2.0:\n"
        "    (x @ x).sum()\n"
        "    time.sleep(0.005)\n"
        "print('done')\n"
    )
    out = tmp_path / "t.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "polyprof",
            "run",
            "--duration",
            "0.8",
            "--no-summary",
            "-o",
            str(out),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    doc = json.loads(out.read_text())
    torch_status = doc["polyprof"]["backends"]["torch"]
    assert "errors" not in torch_status, torch_status
    assert torch_status["activities"] > 0


def test_native_table_top_level_only_hides_nested_ops():
    from polyprof.profiler.averages import native_key_averages

    model, inputs = make_model()
    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function("outer"):
            model(inputs)
    table = native_key_averages(prof.trace).table(top_level_events_only=True)
    names = [
        line.split()[0] for line in table.splitlines()[3:] if line and not line.startswith(("-", "Self"))
    ]
    assert names == ["outer"]


def test_memory_events_carry_torchs_totals():
    from torch.profiler import ProfilerActivity as TA
    from torch.profiler import profile as torch_profile

    from polyprof.profiler import ProfilerActivity, profile

    def work():
        x = torch.ones(256, 256)
        y = x * 2
        del x, y

    work()
    with torch_profile(activities=[TA.CPU], profile_memory=True) as theirs:
        work()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as ours:
        work()
    mem = [a for a in ours.trace.activities if a.name == "[memory]"]
    their_mem = [e for e in theirs.profiler.kineto_results.events() if e.name() == "[memory]"]
    assert [m.args["Bytes"] for m in mem] == [int(e.nbytes()) for e in their_mem]
    assert all(
        {"Device Type", "Device Id", "Bytes", "Total Allocated", "Total Reserved"} <= set(m.args) for m in mem
    )
    assert mem[0].args["Total Allocated"] >= mem[0].args["Bytes"] > 0
