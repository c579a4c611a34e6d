import json
import os
import subprocess
import sys
import textwrap

import pytest

POLYPROF = [sys.executable, "-m", "polyprof"]


def run(args, cwd=None, **kw):
    return subprocess.run([*POLYPROF, *args], capture_output=True, text=True, cwd=cwd, timeout=120, **kw)


@pytest.fixture
def script(tmp_path):
    def make(body):
        path = tmp_path / "script.py"
        path.write_text(textwrap.dedent(body))
        return path

    return make


def test_run_preserves_argv_main_and_exit_code_and_writes_the_trace(script, tmp_path):
    s = script(
        """
        import sys, polyprof
        with polyprof.record_function("user work"):
            print("argv", sys.argv[1:], "name", __name__)
        sys.exit(3)
        """
    )
    out = tmp_path / "t.json"
    r = run(["run", "-o", str(out), str(s), "--lr", "0.1", "-x"])
    assert r.returncode == 3, r.stderr
    assert "argv ['--lr', '0.1', '-x'] name __main__" in r.stdout
    doc = json.loads(out.read_text())
    assert any(e.get("name") == "user work" for e in doc["traceEvents"])
    assert "polyprof summary" in r.stderr and "user work" in r.stderr


def test_run_script_that_raises_keeps_the_trace_and_exits_1(script, tmp_path):
    s = script(
        """
        import polyprof
        with polyprof.record_function("before the crash"):
            pass
        raise ValueError("boom")
        """
    )
    out = tmp_path / "t.json.gz"
    r = run(["run", "--no-summary", "-o", str(out), str(s)])
    assert r.returncode == 1
    assert "ValueError: boom" in r.stderr
    from polyprof.formats import load_trace

    assert [a.name for a in load_trace(out).activities] == ["before the crash"]


def test_unwritable_output_fails_before_the_script_runs(script, tmp_path):
    marker = tmp_path / "ran"
    s = script(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "a-file").write_text("")
    r = run(["run", "-o", str(tmp_path / "a-file" / "dir" / "t.json"), str(s)])
    assert r.returncode == 2 and "cannot make its folder" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists(), "the script must not run when the trace cannot be written"


def test_the_output_folder_is_made_as_torchs_trace_handler_makes_its_own(script, tmp_path):
    s = script("pass\n")
    r = run(["run", "--no-summary", "-o", str(tmp_path / "traces" / "rank{rank}.json.gz"), str(s)])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "traces" / "rank0.json.gz").is_file()


def test_unknown_activity_fails_before_the_script_runs(script, tmp_path):
    marker = tmp_path / "ran"
    s = script(f"open({str(marker)!r}, 'w').write('x')\n")
    r = run(["run", "--activities", "cpu,opencel", "-o", str(tmp_path / "t.json"), str(s)])
    assert r.returncode == 2 and "unknown activity 'OPENCEL'" in r.stderr and "Known activities" in r.stderr
    assert "Traceback" not in r.stderr
    assert not marker.exists()


def test_missing_script_and_bad_duration(tmp_path):
    r = run(["run", str(tmp_path / "nope.py")])
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "s.py").write_text("")
    r = run(["run", "--duration", "-1", str(tmp_path / "s.py")])
    assert r.returncode == 2 and "--duration must be a positive" in r.stderr
    (tmp_path / "s.py").write_text("pass\n")
    for bad in ("nan", "inf"):
        r = run(["run", "--duration", bad, str(tmp_path / "s.py")])
        assert r.returncode == 2 and "--duration must be a positive, finite number" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_duration_stops_profiling_while_the_script_goes_on(script, tmp_path):
    s = script(
        """
        import time, polyprof
        for i in range(8):
            with polyprof.record_function(f"tick {i}"):
                time.sleep(0.1)
        print("finished")
        """
    )
    out = tmp_path / "t.json"
    r = run(["run", "--duration", "0.35", "--no-summary", "-o", str(out), str(s)])
    assert r.returncode == 0 and "finished" in r.stdout
    ticks = [
        e["name"] for e in json.loads(out.read_text())["traceEvents"] if e.get("name", "").startswith("tick")
    ]
    assert 1 <= len(ticks) <= 4, ticks


def test_backends_lists_host_as_available():
    r = run(["backends"])
    assert r.returncode == 0
    line = next(line for line in r.stdout.splitlines() if line.split("│")[1:2] == [" host "] or line.startswith("│ host "))
    assert "available" in line and "CPU" in line and "polyprof" in line


def test_backends_lists_a_broken_plugin_with_its_import_error(tmp_path):
    (tmp_path / "brokenplug.py").write_text("import does_not_exist_anywhere\n")
    env = {**os.environ, "POLYPROF_BACKENDS": "brokenplug:backend", "PYTHONPATH": str(tmp_path)}
    r = run(["backends"], env=env)
    assert r.returncode == 0
    assert "broken" in r.stdout and "does_not_exist_anywhere" in r.stdout
    assert "host" in r.stdout


def test_summary_shows_kinds_per_device(script, tmp_path):
    s = script(
        """
        import polyprof
        for i in range(3):
            with polyprof.record_function("repeated"):
                pass
        """
    )
    out = tmp_path / "t.json"
    assert run(["run", "--no-summary", "-o", str(out), str(s)]).returncode == 0
    r = run(["summary", str(out)])
    assert r.returncode == 0
    assert "user_annotation" in r.stdout
    row = next(line for line in r.stdout.splitlines() if "repeated" in line)
    assert " 3 " in row


def test_version_and_console_script():
    r = (
        subprocess.run(["polyprof", "--version"], capture_output=True, text=True)
        if _on_path()
        else run(["--version"])
    )
    assert r.returncode == 0 and "polyprof" in r.stdout


def _on_path():
    import shutil

    return shutil.which("polyprof") is not None and os.path.dirname(
        shutil.which("polyprof")
    ) == os.path.dirname(sys.executable)


def test_example_workload_runs_under_polyprof(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "w.json.gz"
    r = run(["run", "-o", str(out), os.path.join(root, "examples", "workload.py"), "3"])
    assert r.returncode == 0, r.stderr
    assert "workload result" in r.stdout and "matmul chain" in r.stderr
    # the script marks its own steps around its optimizer's: polyprof run adds no second span of a step
    from polyprof.formats import load_trace

    steps = [name for name in load_trace(str(out)).activities.names() if str(name).startswith("ProfilerStep#")]
    assert sorted(steps) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]


def test_reasons_with_brackets_are_printed_verbatim(tmp_path):
    """Install hints such as polyprof-cuda[cu13] must survive the terminal formatting."""
    (tmp_path / "bracketplug.py").write_text(
        "from polyprof.plugin.backend import API_VERSION, Availability\n"
        "class B:\n"
        "    name, api_version, activities = 'bracket', API_VERSION, frozenset({'BRACKET'})\n"
        "    def probe(self):\n"
        "        return Availability.no(\"pip install 'polyprof-bracket[cu13]' [red]not markup[/red]\")\n"
        "    def create_session(self, c, x): ...\n"
        "backend = B()\n"
    )
    env = {**os.environ, "POLYPROF_BACKENDS": "bracketplug:backend", "PYTHONPATH": str(tmp_path)}
    r = run(["backends"], env=env)
    row = [line for line in r.stdout.splitlines() if "bracket" in line or "markup" in line or "cu13" in line]
    flat = "".join(ch for ch in "".join(row) if ch not in "│ ")  # the reason may wrap inside its cell
    assert "polyprof-bracket[cu13]" in flat and "[red]notmarkup[/red]" in flat
    script = tmp_path / "s.py"
    script.write_text("")
    r = run(["run", "-o", str(tmp_path / "t.json"), str(script)], env=env)
    assert r.returncode == 0 and "polyprof-bracket[cu13]" in "".join(r.stderr.split())


def test_the_run_summary_gives_a_backends_warnings_when_it_has_no_error():
    from polyprof.cli.render import backend_status_lines
    from polyprof.model import BackendStatus, Trace

    trace = Trace(backends={
        "host": BackendStatus("host", activities=3, warnings=["spans cost more: reinstall polyprof"]),
        "broken": BackendStatus("broken", state="failed", errors=["it raised"], warnings=["and warned"]),
        "quiet": BackendStatus("quiet", activities=1),
    })
    assert backend_status_lines(trace) == [
        "host: ran, 3 activities - spans cost more: reinstall polyprof",
        "broken: failed, 0 activities - it raised",
        "quiet: ran, 1 activities",
    ]
