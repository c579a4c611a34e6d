"""The backend in docs/writing-a-backend.md is real code: it runs and passes the conformance kit."""

import os
import re
import sys
import types

import pytest

import polyprof
from polyprof.model import ActivityKind
from polyprof.registry import Registry
from polyprof.testing import assert_conforms

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "writing-a-backend.md")


@pytest.fixture(scope="module")
def toy():
    text = open(DOC).read()
    source = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class ToyBackend" in b)
    module = types.ModuleType("polyprof_toy")
    sys.modules["polyprof_toy"] = module
    exec(compile(source, "polyprof_toy", "exec"), module.__dict__)
    yield module
    del sys.modules["polyprof_toy"]


def launch_three(toy):
    for i in range(3):
        toy.DEVICE.launch(f"kernel {i}")


def test_documented_backend_conforms(toy):
    report = assert_conforms(toy.backend, workload=lambda: launch_three(toy), require_activities=True)
    assert report.activities == 6


def test_documented_backend_maps_its_clock_and_links_its_work(toy):
    reg = Registry(use_env=False)
    reg.register(toy.backend)
    with polyprof.profile(["cpu", "toy"], registry=reg) as prof:
        with polyprof.record_function("outer"):
            launch_three(toy)
    trace = prof.trace
    (outer,) = trace.activities_of(ActivityKind.USER_ANNOTATION)
    kernels = trace.activities_of(ActivityKind.KERNEL)
    launches = trace.activities_of(ActivityKind.RUNTIME)
    assert len(kernels) == 3 and all(k.external_id == outer.correlation for k in kernels)
    for launch, kernel in zip(launches, kernels, strict=True):
        assert kernel.flow_id == launch.flow_id
        assert 0 <= kernel.start - launch.start < 50_000_000, "the 7 s device clock offset was mapped away"
    assert trace.backends["toy"].clock["toy:0"]["offset_ns"] == pytest.approx(-7_000_000_000, abs=10_000_000)
    with pytest.raises(polyprof.ConfigError, match="device 3 does not exist"):
        polyprof.profile(["toy"], registry=reg, backend_options={"toy": {"device": 3}})
