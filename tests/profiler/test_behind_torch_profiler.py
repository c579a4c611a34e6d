"""polyprof behind torch.profiler: the switch (API, POLYPROF_TORCH_PROFILER, polyprof run), what the
installed class promises frameworks, and the activity settings (POLYPROF_ACTIVITIES, config files)."""

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="needs torch (CPU build): the switch replaces torch.profiler's names")

import polyprof  # noqa: E402
import polyprof.profiler  # noqa: E402
from polyprof.errors import ConfigError  # noqa: E402
from polyprof.profiler import behind_torch, settings  # noqa: E402

ORIGINAL = torch.profiler.profile


@pytest.fixture
def switched():
    polyprof.install_torch_profiler()
    try:
        yield torch.profiler.profile
    finally:
        polyprof.uninstall_torch_profiler()


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    return {**env, **extra}


def test_install_replaces_the_names_and_uninstall_gives_them_back(switched):
    import torch.profiler.profiler as module

    assert torch.profiler.profile is switched is module.profile
    assert torch.profiler.schedule is polyprof.profiler.schedule is module.schedule
    assert torch.profiler.tensorboard_trace_handler is polyprof.profiler.tensorboard_trace_handler
    assert torch.profiler.ProfilerActivity is polyprof.profiler.ProfilerActivity
    assert module.ProfilerActivity is torch._C._profiler.ProfilerActivity, "torch's own classes keep theirs"
    assert behind_torch.torch_profiler_installed()
    polyprof.uninstall_torch_profiler()
    assert torch.profiler.profile is ORIGINAL and module.profile is ORIGINAL
    assert torch.profiler.ProfilerActivity is torch._C._profiler.ProfilerActivity
    assert not behind_torch.torch_profiler_installed()


def test_the_installed_class_keeps_torchs_signature_and_isinstance(switched):
    before = ORIGINAL()  # a torch profiler made before the switch
    assert inspect.signature(switched.__init__) == inspect.signature(ORIGINAL.__init__)
    with pytest.raises(TypeError):
        switched(not_an_argument=1)  # refused as torch refuses it
    with pytest.raises(TypeError):
        switched(None)  # keyword-only, as torch's
    made = switched()
    direct = polyprof.profiler.profile()
    for obj in (before, made, direct):
        assert isinstance(obj, torch.profiler.profile) and isinstance(obj, ORIGINAL)
    assert isinstance(made, polyprof.profiler.profile) and not isinstance(before, polyprof.profiler.profile)
    assert issubclass(polyprof.profiler.profile, ORIGINAL) and issubclass(switched, ORIGINAL)


def test_framework_facing_attributes_behave_as_torchs(switched, tmp_path):
    seen = []
    prof = switched(schedule=torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=1),
                    on_trace_ready=lambda p: seen.append(("first", p.step_num)))
    assert isinstance(torch.profiler.schedule(wait=1, warmup=1, active=1)(0), torch.profiler.ProfilerAction)
    prof.start()
    assert prof.profiler is None, "None in the wait steps, as torch's (vLLM tests it)"
    prof.step()
    assert prof.profiler is not None, "an object once the schedule leaves its wait steps"
    prof.on_trace_ready = lambda p: seen.append(("second", p.step_num, isinstance(p, torch.profiler.profile)))
    prof.step()
    torch.ones(3).sum()
    prof.step()
    prof.stop()
    assert seen == [("second", 3, True)], "the handler assigned last runs, with the window's step number"
    assert prof.step_num == 3
    lightning_like = switched(schedule=torch.profiler.schedule(wait=5, warmup=1, active=1))
    lightning_like.start()
    lightning_like.step_num = 10  # writable, as frameworks set them
    lightning_like.schedule = torch.profiler.profiler._default_schedule_fn  # torch's own: torch's actions
    lightning_like.step()
    torch.ones(2).neg()
    lightning_like.stop()
    assert lightning_like.step_num == 11
    assert "aten::neg" in {e.name for e in lightning_like.events()}


def test_a_profiler_of_torchs_own_class_stays_torchs(switched, tmp_path):
    with switched() as ours:
        with pytest.raises(RuntimeError, match="torch's own profiler cannot start while it does"):
            ORIGINAL().start()  # one profiler records ops at a time, as with torch alone: said, not mixed
        torch.ones(2).exp()
    with ORIGINAL() as theirs:
        torch.ones(2).exp()
    theirs.export_chrome_trace(str(tmp_path / "torch.json"))
    ours.export_chrome_trace(str(tmp_path / "polyprof.json"))
    assert "polyprof" not in json.loads((tmp_path / "torch.json").read_text())
    assert "polyprof" in json.loads((tmp_path / "polyprof.json").read_text())
    with ORIGINAL() as theirs:  # torch's first, polyprof's inside it: each records whole, apart
        torch.ones(2).exp()
        with switched() as ours:
            torch.ones(2).neg()
        torch.ones(2).sin()
    ops = {}
    for name, prof in (("torch", theirs), ("polyprof", ours)):
        prof.export_chrome_trace(str(tmp_path / f"{name}2.json"))
        doc = json.loads((tmp_path / f"{name}2.json").read_text())
        ops[name] = ("polyprof" in doc, {e["name"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"})
    assert ops["torch"][0] is False and {"aten::exp", "aten::neg", "aten::sin"} <= ops["torch"][1]
    assert ops["polyprof"][0] is True and "aten::neg" in ops["polyprof"][1]
    assert not {"aten::exp", "aten::sin"} & ops["polyprof"][1]


SCRIPT = textwrap.dedent("""
    import json, multiprocessing, sys, torch
    def child(path):
        with torch.profiler.profile() as p:
            torch.ones(2).sum()
        p.export_chrome_trace(path)
    if __name__ == "__main__":
        child(sys.argv[1] + ".parent.json")
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(target=child, args=(sys.argv[1] + ".child.json",))
        proc.start(); proc.join()
        print(type(torch.profiler.profile).__name__, torch.profiler.profile.__mro__[1].__module__)
""")


def test_the_environment_variable_switches_a_process_that_never_imports_polyprof_and_its_children(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "t")], env=clean_env(POLYPROF_TORCH_PROFILER="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "polyprof.profiler"
    for which in ("parent", "child"):
        assert "polyprof" in json.loads((tmp_path / f"t.{which}.json").read_text()), which
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "u")], env=clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "polyprof" not in json.loads((tmp_path / "u.parent.json").read_text())


def test_polyprof_run_puts_polyprof_behind_torch_profiler_by_default(tmp_path):
    script = tmp_path / "inner.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        x = torch.ones(4) + 1
        with torch.profiler.profile() as p:
            (x * 2).sum()
        p.export_chrome_trace({str(tmp_path / "inner.json")!r})
    """))
    run = [sys.executable, "-m", "polyprof", "run", "--no-summary", "-o"]
    r = subprocess.run([*run, str(tmp_path / "outer.json"), str(script)], env=clean_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "polyprof" in json.loads((tmp_path / "inner.json").read_text()), "the script's profiler is polyprof's"
    outer = json.loads((tmp_path / "outer.json").read_text())
    assert outer["polyprofRun"]["ended"] == "the script started its own profiler"
    assert "aten::add" in {e["name"] for e in outer["traceEvents"]}, "the run's trace covers up to there"
    assert "own profiler" in r.stderr
    r = subprocess.run([*run, str(tmp_path / "outer2.json"), "--no-torch-profiler", str(script)], env=clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "polyprof" not in json.loads((tmp_path / "inner.json").read_text()), "torch's own profiler recorded"
    outer = json.loads((tmp_path / "outer2.json").read_text())
    assert outer["polyprofRun"]["ended"] == "the script started its own profiler", "one profiler at a time"
    assert "aten::add" in {e["name"] for e in outer["traceEvents"]}


def test_activity_edits_add_and_remove_groups_for_every_profile(monkeypatch):
    settings._edits.cache_clear()
    monkeypatch.setenv("POLYPROF_ACTIVITIES", "+counters")
    with polyprof.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(2).sum()
    assert prof.trace.metadata["polyprof"]["activities"] == ["COUNTERS", "CPU"]
    settings._edits.cache_clear()
    monkeypatch.setenv("POLYPROF_ACTIVITIES", "+counters,-counters")
    edits = settings.activity_edits()
    assert edits.apply(["CPU"]) == ["CPU"], "a group both added and removed is left out"
    assert settings.parse("opencl", "x").add == ("OPENCL",)
    settings._edits.cache_clear()


def test_an_unknown_group_is_an_error_naming_the_installed_ones(monkeypatch, tmp_path):
    settings._edits.cache_clear()
    monkeypatch.setenv("POLYPROF_ACTIVITIES", "+opencl,+not_a_device")
    with pytest.raises(ConfigError, match=r"unknown activity group 'NOT_A_DEVICE'; installed groups: .*CPU"):
        polyprof.profiler.profile()
    settings._edits.cache_clear()
    # with the variable alone: one warning line at torch's import, the program runs (pip, and every other
    # Python process in the environment, are not stopped by it)
    r = subprocess.run([sys.executable, "-c", "import torch; print('started')"], env=clean_env(POLYPROF_ACTIVITIES="+nope"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "started\n"
    (line,) = r.stderr.splitlines()
    assert "unknown activity group 'NOPE'" in line and "installed groups" in line, line
    script = tmp_path / "s.py"
    script.write_text("print('started')\n")
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "-o", str(tmp_path / "t.json"), str(script)],
                       env=clean_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "polyprof.toml").write_text('activities = ["+nope"]\n')
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "-o", str(tmp_path / "t.json"), str(script)],
                       env=clean_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0 and "started" not in r.stdout and "polyprof.toml: activities" in r.stderr


def test_configuration_files_are_read_in_the_working_and_the_project_folder(tmp_path, monkeypatch):
    pytest.importorskip("tomllib", reason="needs tomllib (Python 3.11+) to read the files")
    monkeypatch.delenv("POLYPROF_ACTIVITIES", raising=False)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.polyprof]\nactivities = "+counters"\n')
    (tmp_path / "deeper").mkdir()
    monkeypatch.chdir(tmp_path / "deeper")
    settings._edits.cache_clear()
    assert settings.activity_edits().add == ("COUNTERS",)
    assert settings.activity_edits().source.endswith("pyproject.toml: activities")
    (tmp_path / "deeper" / "polyprof.toml").write_text('activities = ["-cuda"]\n')
    settings._edits.cache_clear()
    assert settings.activity_edits().remove == ("CUDA",), "the nearest file wins"
    monkeypatch.setenv("POLYPROF_ACTIVITIES", "+counters")
    settings._edits.cache_clear()
    assert settings.activity_edits().source == "POLYPROF_ACTIVITIES", "the environment wins over files"
    (tmp_path / "deeper" / "polyprof.toml").write_text("activities = [\n")
    monkeypatch.delenv("POLYPROF_ACTIVITIES")
    settings._edits.cache_clear()
    with pytest.raises(ConfigError, match="cannot be read as TOML"):
        settings.activity_edits()
    (tmp_path / "deeper" / "polyprof.toml").unlink()
    (tmp_path / "polyprof.toml").write_text('activities = ["-cpu"]\n')  # the project's own: read
    (tmp_path / "deeper" / "more").mkdir()
    monkeypatch.chdir(tmp_path / "deeper" / "more")
    settings._edits.cache_clear()
    assert settings.activity_edits().remove == ("CPU",)
    os.remove(tmp_path / "pyproject.toml")  # no project: above the working directory is not read
    settings._edits.cache_clear()
    assert not settings.activity_edits()
    settings._edits.cache_clear()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to make a file another user's")
def test_another_users_or_a_writable_configuration_file_is_not_read(tmp_path, monkeypatch, capfd):
    pytest.importorskip("tomllib", reason="needs tomllib (Python 3.11+) to read the files")
    monkeypatch.delenv("POLYPROF_ACTIVITIES", raising=False)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    planted = tmp_path / "polyprof.toml"
    planted.write_text('activities = "-cpu"\n')
    os.chown(planted, 1000, 1000)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    settings._edits.cache_clear()
    assert not settings.activity_edits(), "uid 1000's file one folder up is not read"
    assert f"{planted} not read: it belongs to uid 1000, not to you (uid 0) or root" in capfd.readouterr().err
    os.chown(planted, 0, 0)
    planted.chmod(0o666)
    settings._edits.cache_clear()
    assert not settings.activity_edits()
    assert "others may write it (mode 0666)" in capfd.readouterr().err
    planted.chmod(0o644)
    settings._edits.cache_clear()
    assert settings.activity_edits().remove == ("CPU",), "the project's own file, as it should be"
    planted.unlink()
    planted.symlink_to("/dev/zero")
    settings._edits.cache_clear()
    assert not settings.activity_edits() and "not read" in capfd.readouterr().err
    settings._edits.cache_clear()
