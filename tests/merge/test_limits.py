"""Size controls: short host spans, names by pattern, kinds, a cap per backend; each dropped row counted
on its backend's status, bad limits refused before anything starts."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from fake_backends import SimDeviceBackend

import polyprof
from polyprof.errors import ConfigError
from polyprof.merge.limits import CAPPED, KIND, NAMED, SHORT


def _record(sim):
    for i in range(10):
        with polyprof.record_function(f"long {i}"):
            time.sleep(0.002)
            sim.launch(f"kernel {i}")
        with polyprof.record_function("noise"):
            pass
        polyprof.instant("mark")


def test_each_limit_drops_what_it_names_and_counts_it(registry):
    sim = SimDeviceBackend()
    registry.register(sim)
    limits = {"min_host_span_ns": 1_000_000, "exclude": ("kernel 3",), "exclude_kinds": ("cpu_instant_event",),
              "max_events_per_backend": 8}
    with polyprof.profile(["cpu", "simdev"], registry=registry, limits=limits) as prof:
        _record(sim)
    trace = prof.trace
    names = [a.name for a in trace.activities]
    host = trace.backends["host"].dropped
    assert "noise" not in names and host[SHORT] == 10, "the 10 empty spans are shorter than 1 ms"
    assert "mark" not in names and host[KIND] == 10
    assert [n for n in names if n.startswith("long")] == [f"long {i}" for i in range(8)] and host[CAPPED] == 2
    sim_status = trace.backends["simdev"].dropped
    assert "kernel 3" not in names and sim_status[NAMED] == 1
    # simLaunch rows are host spans of a few µs: below 1 ms too; the kernels left are capped at 8
    assert sim_status[SHORT] == 10 and sim_status[CAPPED] == 1
    assert sorted(n for n in names if n.startswith("kernel")) == [f"kernel {i}" for i in (0, 1, 2, 4, 5, 6, 7, 8)]
    assert not trace.backends["host"].warnings, "chosen drops are not problems"


def test_include_keeps_only_matching_names(registry):
    with polyprof.profile(["cpu"], registry=registry, limits=polyprof.Limits(include=("long*",))) as prof:
        _record(SimDeviceBackend())
    assert {a.name for a in prof.trace.activities} == {f"long {i}" for i in range(10)}
    assert prof.trace.backends["host"].dropped[NAMED] == 20


@pytest.mark.parametrize(
    "limits, message",
    [
        ({"min_span": 3}, "unknown limit"),
        ({"min_host_span_ns": -1}, "min_host_span_ns must be"),
        ({"min_host_span_ns": float("nan")}, "min_host_span_ns must be"),
        ({"include": [""]}, "include takes name patterns"),
        ({"exclude_kinds": ["gpu"]}, "is not an activity kind"),
        ({"max_events_per_backend": 1.5}, "max_events_per_backend must be"),
        ("fast", "limits must be polyprof.Limits"),
    ],
)
def test_bad_limits_are_refused_before_anything_starts(registry, limits, message):
    with pytest.raises(ConfigError, match=message):
        polyprof.profile(["cpu"], registry=registry, limits=limits)


def test_polyprof_run_takes_the_limits(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import time, polyprof
        for i in range(50):
            with polyprof.record_function(f"step {i}"):
                time.sleep(0.001)
            with polyprof.record_function("tiny"):
                pass
        """))
    out = tmp_path / "t.json"
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "--activities", "cpu", "--no-summary", "-o", str(out),
                        "--min-span-us", "100", "--exclude", "step 4*", "--max-events", "20", str(script)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    assert len(names) == 20 and "tiny" not in names and not any(n.startswith("step 4") for n in names)
    dropped = doc["polyprof"]["backends"]["host"]["dropped"]
    assert dropped[SHORT] == 50 and dropped[NAMED] == 11 and dropped[CAPPED] == 50 - 11 - 20
    bad = subprocess.run([sys.executable, "-m", "polyprof", "run", "--exclude-kind", "nonsense", str(script)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "is not an activity kind" in bad.stderr
