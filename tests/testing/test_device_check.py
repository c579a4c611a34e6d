"""The device-check harness (polyprof.testing.device_check) as the plugins' scripts run it: each part in
a process of its own, a failure or a hang reported in the report and not fatal, the check's budget kept,
the report rewritten after every part."""

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    """A device check of nothing."""
    import sys, time
    from polyprof.testing.device_check import DeviceCheck

    def verdicts(results):
        return [f"- {name}: {'**failed**' if 'error' in r else r.get('value')}" for name, r in results.items()]

    CHECK = DeviceCheck("example device check", report=verdicts, report_name="example-report.md", timeout_s=3)

    @CHECK.part
    def works(trace):
        open(trace, "w").write("{}")
        return {"value": 42, "trace": trace}

    @CHECK.part
    def raises(trace):
        raise RuntimeError("the device is not there")

    @CHECK.part
    def hangs(trace):
        time.sleep(60)

    @CHECK.part
    def slow(trace):
        time.sleep(1.5)
        return {"value": "slow"}

    CHECK.code_part("program", "import json; print('noise'); print(json.dumps({'value': 7}))")
    CHECK.code_part("no_result", "print('no json here')")

    if __name__ == "__main__":
        CHECK.main()
''')


def _check(tmp_path, *args, env=None):
    script = tmp_path / "device-check.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)


def test_every_part_runs_in_its_process_and_a_failure_or_a_hang_is_reported(tmp_path):
    r = _check(tmp_path, "--out", str(tmp_path / "report.md"))
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "report.md").read_text()
    assert report.split("\n", 1)[1].rstrip() == r.stdout.split("\n", 1)[1].rstrip(), "the last report written is the one printed"
    assert report.startswith("# example device check (")
    assert "- works: 42" in report and "- program: 7" in report and "- slow: slow" in report
    for failed in ("raises", "hangs", "no_result"):
        assert f"- {failed}: **failed**" in report
    raw = json.loads(report.split("```json\n")[1].split("\n```")[0])
    assert raw["hangs"] == {"error": "timed out after 3 s"}
    assert "RuntimeError: the device is not there" in raw["raises"]["error"]
    assert "no JSON result" in raw["no_result"]["error"]
    assert raw["works"]["trace"].endswith("works.json") and raw["works"]["part_seconds"] >= 0
    assert [line.split(": ")[1] for line in r.stderr.splitlines() if line.startswith("[device-check]")] == [
        "ok", "failed", "failed", "ok", "ok", "failed"]


def test_the_budget_is_kept_and_the_report_goes_to_out_by_default(tmp_path):
    """--budget-s: a part that would start with less left than its time limit (10 s at most) is not run, and says so; the report is
    written to $OUT/<report_name> where the variable is set (the device machine's folder)."""
    import os

    out = tmp_path / "out"
    out.mkdir()
    r = _check(tmp_path, "--parts", "slow,works,program", "--budget-s", "4", env={**os.environ, "OUT": str(out)})
    assert r.returncode == 0, r.stderr
    raw = json.loads((out / "example-report.md").read_text().split("```json\n")[1].split("\n```")[0])
    assert raw["slow"]["value"] == "slow"
    assert raw["works"] == raw["program"] == {"error": "not run: the check's time budget (--budget-s) was spent"}


def test_one_part_in_this_process_and_an_unknown_part(tmp_path):
    r = _check(tmp_path, "--part", "works", "--trace", str(tmp_path / "t.json"))
    assert r.returncode == 0 and json.loads(r.stdout) == {"value": 42, "trace": str(tmp_path / "t.json")}
    r = _check(tmp_path, "--parts", "works,nonsense")
    assert r.returncode != 0 and "unknown parts: nonsense" in r.stderr and "works, raises" in r.stderr
