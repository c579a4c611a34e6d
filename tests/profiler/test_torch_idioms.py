"""torch's idioms under the switch, each as users write them, in a real process switched on as users
switch it on (POLYPROF_TORCH_PROFILER, polyprof run): ProfilerActivity members that are torch's,
supported_activities, _KinetoProfile, nested profiles, the event tree's extra_fields, torch's own
profiler beside polyprof's, the variable's yes/no values and a broken configuration file."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="needs torch (CPU build): these are torch.profiler's idioms")

import polyprof.profiler as pp  # noqa: E402


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    return {**env, **extra}


def run_script(tmp_path, source: str, *, env: dict | None = None, polyprof_run: list[str] | None = None,
               timeout: int = 300) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    command = [sys.executable, "-m", "polyprof", "run", *polyprof_run, str(script)] if polyprof_run is not None else [
        sys.executable, str(script)]
    return subprocess.run(command, cwd=tmp_path, env=env or clean_env(POLYPROF_TORCH_PROFILER="1"), capture_output=True,
                          text=True, timeout=timeout)


def last_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_profiler_activity_members_are_torchs_and_kineto_profile_takes_them(tmp_path):
    found = last_json(run_script(tmp_path, """
        import json, torch, torch.profiler as tp
        from torch.profiler import ProfilerActivity
        C = torch._C._profiler.ProfilerActivity
        kineto = tp._KinetoProfile(activities=[ProfilerActivity.CPU])
        kineto.start(); torch.ones(3).add(1); kineto.stop()
        print(json.dumps({
            "same": ProfilerActivity.CPU is C.CPU, "equal": ProfilerActivity.CPU == C.CPU,
            "hash": hash(ProfilerActivity.CPU) == hash(C.CPU), "isinstance": isinstance(C.CPU, ProfilerActivity),
            "in_supported": ProfilerActivity.CPU in tp.supported_activities(),
            "plugin_groups": sorted(str(a) for a in tp.supported_activities() if not isinstance(a, C)),
            "kineto_events": len(kineto.events()),
        }))
    """))
    assert found["same"] and found["equal"] and found["hash"] and found["isinstance"]
    assert found["in_supported"], "`if ProfilerActivity.CPU in supported_activities()` holds"
    assert "OPENCL" in found["plugin_groups"], "supported_activities lists what plugins add"
    assert found["kineto_events"] > 0, "_KinetoProfile takes the members and records"


def test_a_profile_started_inside_a_running_one_raises_torchs_runtime_error_and_the_outer_one_is_written(tmp_path):
    r = run_script(tmp_path, """
        import torch
        from torch.profiler import profile, schedule, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as outer:
            try:
                with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as inner:
                    for _ in range(5):
                        torch.ones(8).add(1)
                        inner.step()
            except RuntimeError as exc:
                print("inner:", type(exc).__name__, exc)
            torch.ones(8).mul(2)
        outer.export_chrome_trace("outer.json")
        print("outer ops:", sum(e.name == "aten::mul" for e in outer.events()))
    """)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "inner: ProfilerBusyError another polyprof profile is already recording" in r.stdout
    assert "outer ops: 1" in r.stdout and (tmp_path / "outer.json").is_file()


def _input(value):
    """An op input as compared: a tensor's metadata (a tensor list's dtypes are not in the trace)."""
    if isinstance(value, list):
        return [(*_input(v)[:3], "?") for v in value]
    if hasattr(value, "sizes"):
        return value.sizes, value.strides, str(value.layout), str(value.dtype), str(value.device), value.dim
    return value


@pytest.mark.parametrize("options", [{"profile_memory": True}, {"record_shapes": True}], ids=["profile_memory", "record_shapes"])
def test_the_event_tree_carries_torchs_op_and_allocation_fields(options):
    def tree_fields(module) -> list[tuple]:
        with module.profile(activities=[module.ProfilerActivity.CPU], **options) as prof:
            x = torch.ones(4, 3).add(torch.ones(3), alpha=2)
            torch.cat([x, x]).long().sum()
        out = []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop(0)
            f = node.extra_fields
            if node.name == "[memory]":
                out.append(("alloc", type(f).__mro__[1 if f.__class__.__module__ != "torch._C._profiler" else 0].__name__,
                            f.alloc_size, f.total_reserved, f.id, f.allocation_id, str(f.device)))
            else:
                base = next(c for c in type(f).__mro__ if c.__module__ == "torch._C._profiler")
                out.append(("op", base.__name__, f.name, str(f.scope), f.sequence_number, [_input(i) for i in f.inputs]))
            stack[:0] = node.children
        return out

    theirs, ours = tree_fields(torch.profiler), tree_fields(pp)
    assert [row[:2] for row in ours] == [row[:2] for row in theirs]
    assert ours == theirs, "names, scopes, sequence numbers, inputs, sizes and devices as torch's"


def test_no_torch_profiler_runs_a_script_whose_torch_profiler_has_a_schedule(tmp_path):
    source = """
        import torch
        from torch.profiler import profile, schedule, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                     on_trace_ready=lambda p: print("torch's trace ready:", len(p.events()) > 0)) as prof:
            for _ in range(5):
                torch.ones(64, 64).matmul(torch.ones(64, 64))
                prof.step()
        print("script done")
    """
    r = run_script(tmp_path, source, env=clean_env(), polyprof_run=["--no-summary", "--no-torch-profiler", "-o", "run.json"])
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    assert "torch's trace ready: True" in r.stdout and "script done" in r.stdout
    assert "torch.profiler, torch's own" in r.stderr and (tmp_path / "run.json").is_file(), "the run's trace ends there"


def test_torchs_own_profiler_inside_a_polyprof_profile_is_a_runtime_error_not_a_crash(tmp_path):
    r = run_script(tmp_path, """
        import torch, polyprof.profiler as pp
        with pp.profile(activities=[pp.ProfilerActivity.CPU]) as p:
            try:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                    torch.ones(3)
            except RuntimeError as exc:
                print("refused:", exc)
            torch.ones(3).add(2)
        print("ops after:", sum(e.name == "aten::add" for e in p.events()))
    """, env=clean_env())
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    assert "refused: polyprof is recording this process's operators" in r.stdout and "ops after: 1" in r.stdout


@pytest.mark.parametrize("value", ["0", "false", "off", "no", "1", "true", "on", "yes", "maybe"])
def test_the_switch_variable_takes_what_users_write_and_0_turns_off_polyprof_runs_default(tmp_path, value):
    r = run_script(tmp_path, """
        import torch
        from polyprof.profiler.behind_torch import torch_profiler_installed
        print("switched:", torch_profiler_installed())
    """, env=clean_env(POLYPROF_TORCH_PROFILER=value), polyprof_run=["--no-summary", "-o", "t.json"])
    if value == "maybe":
        assert r.returncode == 2 and "POLYPROF_TORCH_PROFILER='maybe': give 1 (on) or 0 (off)" in r.stderr
        assert "Traceback" not in r.stderr
        return
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"switched: {value in ('1', 'true', 'on', 'yes')}" in r.stdout


@pytest.mark.parametrize("table", ['[tool.polyprof]\nactivities = 5\n', '[tool.polyprof\nactivities = "+cpu"\n',
                                   '[tool.polyprof]\nactivities = "+nosuch"\n'], ids=["not a list", "not TOML", "unknown group"])
def test_a_broken_configuration_file_is_one_line_and_the_frameworks_profiler_runs(tmp_path, table):
    (tmp_path / "pyproject.toml").write_text(table)
    r = run_script(tmp_path, """
        import torch
        from torch.profiler import profile, schedule, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1)) as prof:
            for _ in range(3):
                torch.ones(8).add(1)
                prof.step()
        print("trained, profiled:", len(prof.events()) >= 0)
    """)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    said = [line for line in r.stderr.splitlines() if "pyproject.toml" in line]
    assert len(said) == 1 and "ignored by the profilers torch.profiler makes" in said[0], r.stderr
    assert "trained, profiled: True" in r.stdout


@pytest.mark.parametrize("switch", ["1", "0"], ids=["polyprof behind torch.profiler", "torch's own profiler"])
def test_the_flight_recorder_steps_aside_for_the_scripts_profiler_and_records_again_after(tmp_path, switch):
    r = run_script(tmp_path, """
        import json, torch
        from polyprof.flight.recorder import running
        model = torch.nn.Linear(32, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def step():
            model(torch.randn(8, 32)).sum().backward(); optimizer.step(); optimizer.zero_grad()
        for _ in range(3):
            step()
        with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:
            for _ in range(5):
                step()
                prof.step()
        ops = sum(e.name == "aten::addmm" for e in prof.events())
        for _ in range(10):
            step()
        recorder = running()
        recorder.capture("manual")
        recorder.stop()
        print(json.dumps({"ops": ops, "aside": recorder.stepped_aside, "captures": recorder.captures,
                          "failures": recorder.failures, "recording_after": recorder.profile is None}))
    """, env=clean_env(POLYPROF_FLIGHT_RECORDER="30", POLYPROF_TORCH_PROFILER=switch,
                       POLYPROF_FLIGHT_DIR=str(tmp_path / "flight")))
    found = last_json(r)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert found["ops"] == 2, "the script's profiler records its two active steps whole"
    assert found["aside"] == 1 and not found["failures"]
    (capture,) = [c for c in found["captures"] if "flight-manual-" in c]  # (a slow first step may be one too)
    from polyprof.formats import load_trace

    steps = [a for a in load_trace(capture).activities if a.name.startswith("ProfilerStep#")]
    assert len(steps) >= 9, "the recorder records again after the script's profiler stopped"
