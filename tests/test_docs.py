"""The backend in docs/writing-a-backend.md is real code: it runs and passes the conformance kit."""

import os
import re
import sys
import types

import pytest

import polyprof
from polyprof.engine.registry import Registry
from polyprof.model import ActivityKind
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


def _interleaved_tasks(toy, before_launch=lambda: None):
    """Task A opens its annotation, B opens its own, A launches, B launches: on one thread, the
    innermost span open at A's launch is B's."""
    import asyncio

    async def task(name, mine, theirs):
        with polyprof.record_function(f"task {name}"):
            mine.set()
            await theirs.wait()
            await asyncio.sleep(0.001 if name == "B" else 0)  # A launches first
            before_launch()
            toy.DEVICE.launch(f"kernel of {name}")
            await asyncio.sleep(0.002)

    async def main():
        a_open, b_open = asyncio.Event(), asyncio.Event()
        await asyncio.gather(task("A", a_open, b_open), task("B", b_open, a_open))

    asyncio.run(main())


@pytest.mark.parametrize("with_torch", [False, True], ids=["toy backend", "toy backend and torch's ops"])
def test_interleaved_asyncio_tasks_each_get_their_own_kernels(toy, with_torch):
    reg = Registry(use_env=False)
    reg.register(toy.backend)
    before = lambda: None  # noqa: E731
    if with_torch:
        torch = pytest.importorskip("torch", reason="needs torch for the torch backend's ops")
        from polyprof.backends.torch.backend import backend as torch_backend

        reg.register(torch_backend)
        x = torch.ones(4)
        before = lambda: torch.add(x, x)  # noqa: E731 - an aten op recorded on the same thread
    with polyprof.profile(["cpu", "toy"], registry=reg) as prof:
        _interleaved_tasks(toy, before)
    trace = prof.trace
    spans = {a.name: a.correlation for a in trace.activities_of(ActivityKind.USER_ANNOTATION)}
    kernels = {k.name: k.external_id for k in trace.activities_of(ActivityKind.KERNEL)}
    assert kernels == {"kernel of A": spans["task A"], "kernel of B": spans["task B"]}
    launches = trace.activities_of(ActivityKind.RUNTIME)
    assert sorted(r.external_id for r in launches) == sorted(kernels.values())
    device_spans = {g.name for g in trace.activities_of(ActivityKind.GPU_USER_ANNOTATION)}
    assert device_spans == {"task A", "task B"}
    if with_torch:
        assert any(op.name == "aten::add" for op in trace.activities_of(ActivityKind.CPU_OP))
