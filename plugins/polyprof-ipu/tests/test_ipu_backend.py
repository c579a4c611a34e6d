"""The ipu backend against a stand-in pva module shaped after the documented PopVision Analysis API
(openReport -> report.compilation.target.clockFrequency, report.execution.runs[i].{name, microseconds,
steps[j].{program.name, ipus[k].cycles}}, report.poplarVersion.string); the workload plays Poplar and
writes profile.pop where POPLAR_ENGINE_OPTIONS says."""

import json
import os
import sys
import time
import types

import pytest

import polyprof
from polyprof.model import ActivityKind

NS = types.SimpleNamespace


def fake_pva(runs):
    """`runs`: the execution runs, or a function making them when the report is opened."""
    m = types.ModuleType("pva")
    m.__version__ = "3.4.0"
    opened = []

    def openReport(path):
        opened.append(path)
        return NS(poplarVersion=NS(string="3.4.0 (stand-in)"),
                  compilation=NS(target=NS(clockFrequency=1.85e9, numTiles=1472)),
                  execution=NS(runs=runs() if callable(runs) else runs))

    m.openReport = openReport
    m.opened = opened
    return m


def poplar_writes_its_report():
    """What a Poplar engine does at its end when POPLAR_ENGINE_OPTIONS asks for a report."""
    folder = json.loads(os.environ["POPLAR_ENGINE_OPTIONS"])["autoReport.directory"]
    os.makedirs(os.path.join(folder, "training"), exist_ok=True)
    with open(os.path.join(folder, "training", "profile.pop"), "wb") as f:
        f.write(b"stand-in")


def test_runs_and_steps_land_on_each_ipu_at_their_host_time(monkeypatch):
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    ran_at = {}
    step = lambda name, *cycles: NS(program=NS(name=name), ipus=[NS(cycles=c) for c in cycles])  # noqa: E731

    def runs():
        start_us = ran_at["us"]
        return [NS(name="run 0", microseconds=NS(start=start_us, end=start_us + 5000),
                   steps=[step("StreamCopy", 1850, 925), step("Execute", 3_700_000, 1_850_000)]),
                NS(name="run 1", microseconds=NS(start=start_us + 10_000, end=start_us + 15_000),
                   steps=[step("Execute", 1_850_000, 1_850_000)])]

    pva = fake_pva(runs)
    monkeypatch.setitem(sys.modules, "pva", pva)
    with polyprof.profile(["cpu", "ipu"]) as prof:
        assert "autoReport.all" in os.environ["POPLAR_ENGINE_OPTIONS"], "asked for by the backend at prepare"
        ran_at["us"] = time.time() * 1e6  # the program runs its engine: two runs, 10 ms apart
        time.sleep(0.02)
        poplar_writes_its_report()
        made = json.loads(os.environ["POPLAR_ENGINE_OPTIONS"])["autoReport.directory"]
    assert "POPLAR_ENGINE_OPTIONS" not in os.environ, "given back at the end"
    assert not os.path.exists(made), "the temporary folder made for Poplar's report is removed at the end"
    trace = prof.trace
    rows = [a for a in trace.activities if a.kind == ActivityKind.KERNEL]
    by_ipu = {}
    for a in rows:
        by_ipu.setdefault(trace.devices[a.device].key, []).append(a)
    assert sorted(by_ipu) == ["ipu:0", "ipu:1"]
    ipu0 = sorted(by_ipu["ipu:0"], key=lambda a: a.start)
    assert [a.name for a in ipu0] == ["StreamCopy", "Execute", "Execute"]
    assert ipu0[1].end - ipu0[1].start == pytest.approx(2_000_000, rel=1e-6), "3.7 M cycles at 1.85 GHz: 2 ms"
    assert ipu0[1].start == ipu0[0].end, "a run's steps follow one another"
    assert ipu0[2].start - ipu0[0].start == pytest.approx(10_000_000, abs=2000), "runs at their host timestamps"
    assert ipu0[0].args == {"cycles": 1850, "run": "run 0", "step": 0}
    status = trace.backends["ipu"]
    assert status.details["poplar"] == "3.4.0 (stand-in)" and "after the run" in status.details["timeline"]
    assert pva.opened and pva.opened[0].endswith(os.path.join("training", "profile.pop"))


def test_a_report_dir_named_by_the_user_is_kept(monkeypatch, tmp_path):
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    monkeypatch.setitem(sys.modules, "pva", fake_pva([]))
    with polyprof.profile(["cpu", "ipu"], backend_options={"ipu": {"report_dir": str(tmp_path)}}) as prof:
        assert json.loads(os.environ["POPLAR_ENGINE_OPTIONS"])["autoReport.directory"] == str(tmp_path)
        poplar_writes_its_report()
    assert (tmp_path / "training" / "profile.pop").read_bytes() == b"stand-in"
    assert prof.trace.backends["ipu"].details["report"] == str(tmp_path / "training" / "profile.pop")


def test_no_report_is_said_and_a_users_engine_options_are_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps({"autoReport.all": "true", "autoReport.directory": str(tmp_path)}))
    monkeypatch.setitem(sys.modules, "pva", fake_pva([]))
    with pytest.warns(polyprof.PolyprofWarning, match="Poplar wrote no profile.pop in"):
        with polyprof.profile(["cpu", "ipu"]):
            pass
    assert json.loads(os.environ["POPLAR_ENGINE_OPTIONS"])["autoReport.directory"] == str(tmp_path)


def test_without_the_poplar_sdk_it_says_so(monkeypatch):
    from polyprof_ipu.ipu_backend import backend

    monkeypatch.setitem(sys.modules, "pva", None)
    reason = backend.probe().reason
    assert "pva module of a Poplar SDK" in reason and "legacy" in reason
