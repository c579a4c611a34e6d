"""The pvti backend against a stand-in libpvti module (tests/stand_in/libpvti.py): tracepoints, instant
events and series samples land on polyprof's timeline while every call still reaches libpvti, and
libpvti is left as it was after the profile. Not exercised: the real libpvti of a Poplar SDK."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from polyprof_ipu.pvti_backend import PvtiBackend

import polyprof
from polyprof.engine.registry import Registry
from polyprof.model import ActivityKind

STAND_IN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_in")


@pytest.fixture
def pvti(monkeypatch):
    monkeypatch.syspath_prepend(STAND_IN)
    sys.modules.pop("libpvti", None)
    import libpvti

    libpvti.calls.clear()
    yield libpvti
    sys.modules.pop("libpvti", None)


def profile(work):
    reg = Registry(use_env=False)
    reg.register(PvtiBackend())
    with polyprof.profile(["cpu", "ipu"], registry=reg) as prof:
        work()
    return prof.trace


def test_tracepoints_events_and_samples_reach_both_libpvti_and_the_trace(pvti):
    early = pvti.createTraceChannel("Early")  # before the profile: named by its own name attribute
    original = pvti.Tracepoint

    def work():
        app = pvti.createTraceChannel("MNIST Application")
        loss = pvti.Graph("Loss", "").addSeries("Training Loss")
        with pvti.Tracepoint(app, "Epoch:0"):
            with pvti.Tracepoint(app, "batch"):
                loss.add(0.5)
            pvti.Tracepoint.event(app, "checkpoint")
        thread = threading.Thread(target=lambda: pvti.Tracepoint(early, "loader").__enter__().__exit__(None, None, None))
        thread.start()
        thread.join()

    trace = profile(work)
    assert pvti.Tracepoint is original, "libpvti as it was after the profile"
    assert pvti.calls == [("begin", "MNIST Application", "Epoch:0"), ("begin", "MNIST Application", "batch"),
                          ("sample", "Training Loss", 0.5), ("end", "MNIST Application", "batch"),
                          ("event", "MNIST Application", "checkpoint"), ("end", "MNIST Application", "Epoch:0"),
                          ("begin", "Early", "loader"), ("end", "Early", "loader")]
    acts = {a.name: a for a in trace.activities}
    epoch, batch, loader = acts["Epoch:0"], acts["batch"], acts["loader"]
    assert epoch.kind == batch.kind == ActivityKind.USER_ANNOTATION and epoch.cat == "pvti:MNIST Application"
    assert epoch.start <= batch.start <= batch.end <= epoch.end, "nested as they ran"
    assert acts["checkpoint"].kind == ActivityKind.INSTANT and batch.end <= acts["checkpoint"].start <= epoch.end
    assert loader.cat == "pvti:Early" and loader.resource != epoch.resource, "on the thread that ran it"
    samples = [(s.name, s.value) for s in trace.counters.samples]
    assert samples == [("Loss.Training Loss", 0.5)]


def test_outside_a_profile_nothing_is_wrapped(pvti):
    channel = pvti.createTraceChannel("c")
    profile(lambda: None)
    with pvti.Tracepoint(channel, "after"):
        pass
    assert type(pvti.Tracepoint(channel, "x")).__module__ == "libpvti"


SCRIPT = "from polyprof_ipu.pvti_backend import PvtiBackend; print(PvtiBackend().probe().reason)"


def test_without_libpvti_it_says_where_it_comes_from():
    env = {k: v for k, v in os.environ.items() if k != "PVTI_OPTIONS"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
    assert "libpvti is not imported here" in r.stdout and "Poplar SDK" in r.stdout
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                       env={**env, "PVTI_OPTIONS": '{"enable":"true"}'})
    assert "libpvti is not imported here" in r.stdout, "PVTI_OPTIONS set, but no libpvti to import"


def test_conformance_kit(pvti):
    from polyprof.testing import assert_conforms

    channel = pvti.createTraceChannel("kit")
    assert_conforms(PvtiBackend(), workload=lambda: pvti.Tracepoint(channel, "x").__enter__().__exit__(None, None, None))
