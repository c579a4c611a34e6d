"""polyprof-xpu against a compiled double of PTI's View API (both record layouts), and against the real
intel-pti wheel on a machine without an Intel GPU. Not exercised: real PTI on an Intel GPU."""

import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest
from polyprof_xpu import XpuBackend, abi

import polyprof
from polyprof.engine.registry import Registry
from polyprof.model import ActivityKind
from polyprof.testing import assert_conforms


def fresh_registry():
    reg = Registry(use_env=False)
    reg.register(XpuBackend())
    return reg


def profile(workload, activities=("cpu", "xpu"), **kw):
    with polyprof.profile(list(activities), registry=fresh_registry(), **kw) as prof:
        workload()
    return prof.trace


def test_ctypes_layouts_have_the_c_sizes(pti):
    v2 = pti.layout == "v2"
    layouts = abi.layouts(v2)
    for kind in (
        abi.VIEW_DEVICE_GPU_KERNEL,
        abi.VIEW_DEVICE_GPU_MEM_COPY,
        abi.VIEW_DEVICE_GPU_MEM_FILL,
        abi.VIEW_RUNTIME_API,
        abi.VIEW_EXTERNAL_CORRELATION,
        abi.VIEW_DEVICE_SYNCHRONIZATION,
        abi.VIEW_COLLECTION_OVERHEAD,
    ):
        assert ctypes.sizeof(layouts[kind]) == pti.lib.fakePtiRecordSize(kind), kind
    if v2:  # a v2 record is its v1 record followed by the new fields (PTI's static asserts)
        assert abi.KernelV2._device_handle.offset == ctypes.sizeof(abi.Kernel)
        assert abi.MemcpyV2._device_handle.offset == ctypes.sizeof(abi.Memcpy)
        assert abi.FillV2._device_handle.offset == ctypes.sizeof(abi.Fill)


def test_whole_path_kernels_copies_fills_on_two_devices_and_several_queues(pti):
    def work():
        with polyprof.record_function("step"):
            pti.copy(memcpy_type=6, src=1, dst=2, nbytes=1 << 20, queue=1, device=0)  # H2D
            pti.kernel("gemm", queue=1, device=0)
            pti.kernel("softmax", queue=2, device=0)
            pti.kernel("allgather_pack", queue=5, device=1)
            pti.fill(nbytes=4096, value=7, queue=2, device=0)
            pti.copy(memcpy_type=9, src=2, dst=1, nbytes=4096, queue=1, device=0)  # D2H
        pti.lib.fakePtiEmitSync()
        pti.lib.fakePtiEmitOverhead()

    trace = profile(work)
    kernels = trace.activities_of(ActivityKind.KERNEL)
    copies = trace.activities_of(ActivityKind.GPU_MEMCPY)
    fills = trace.activities_of(ActivityKind.GPU_MEMSET)
    runtime = trace.activities_of(ActivityKind.RUNTIME)
    driver = trace.activities_of(ActivityKind.DRIVER)
    assert sorted(k.name for k in kernels) == ["allgather_pack", "gemm", "softmax"]
    assert sorted(c.name for c in copies) == ["Memcpy D2H (Device -> Host)", "Memcpy H2D (Host -> Device)"]
    assert [f.name for f in fills] == ["Memset (7 -> Device)"]
    assert {r.cat for r in runtime} == {"xpu_runtime"} and {d.cat for d in driver} == {"xpu_driver"}
    assert {r.name for r in runtime} == {"urEnqueueKernelLaunch", "urEnqueueUSMMemcpy", "urEnqueueUSMFill"}
    # devices by PCI address, one row per queue
    gpus = sorted((d.name, d.pid) for d in trace.devices if d.type == "xpu")
    assert gpus == [("Intel GPU 0 (0000:3a:00.0)", 0), ("Intel GPU 1 (0000:9a:00.0)", 1)]
    rows = sorted({(trace.devices[k.device].index, trace.resources[k.resource].name) for k in kernels})
    assert rows == [(0, "queue 1"), (0, "queue 2"), (1, "queue 5")]
    gemm = next(k for k in kernels if k.name == "gemm")
    assert gemm.args["sycl queue"] == 1 and gemm.args["stream"] == 1 and gemm.args["device"] == 0
    assert gemm.args["l0 queue"] == hex(0x1001)
    assert ("engine index" in gemm.args) == (pti.layout == "v2")
    assert copies[0].args["bytes"] in (1 << 20, 4096) and "memory bandwidth (GB/s)" in copies[0].args
    # flows: the runtime call starts each; the driver call does not duplicate it
    starts = {r.flow_id: r for r in runtime if r.flow_start}
    assert all(d.flow_id == 0 for d in driver)
    step = trace.activities_of(ActivityKind.USER_ANNOTATION)[0]
    for a in kernels + copies + fills:
        assert starts[a.flow_id].external_id == a.external_id == step.correlation
    # syncs and overhead
    (sync,) = trace.activities_of(ActivityKind.SYNC)
    assert sync.name == "Host Event Sync" and sync.cat == "xpu_sync"
    (overhead,) = trace.activities_of(ActivityKind.OVERHEAD)
    assert overhead.name == "Buffer Flush"
    assert trace.metadata["xpupti_version"] == ("1.2.0" if pti.layout == "v2" else "0.10.0")


def test_clock_mapping_from_pti_timestamps(pti):
    trace = profile(lambda: [pti.kernel("k") for _ in range(3)])
    clock = trace.backends["xpu"].clock["pti"]
    expected = time.time_ns() - time.perf_counter_ns()  # the double stamps CLOCK_REALTIME, like PTI
    assert abs(clock["offset_ns"] - (-expected)) < 5_000_000 and clock["pairs"] >= 3
    launches = {r.flow_id: r for r in trace.activities_of(ActivityKind.RUNTIME)}
    w0, w1 = trace.window
    for k in trace.activities_of(ActivityKind.KERNEL):
        assert w0 <= launches[k.flow_id].start <= k.start <= w1 + 1_000_000


def test_external_correlation_push_pop_balanced_and_nested(pti):
    with polyprof.profile(["cpu", "xpu"], registry=fresh_registry()) as prof:
        with polyprof.record_function("outer"):
            pti.kernel("a")
            with polyprof.record_function("inner"):
                pti.kernel("b")
    assert pti.lib.fakePtiStackDepth(abi.EXTERNAL_KIND_CUSTOM_1) == 0
    ann = {a.name: a.correlation for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)}
    assert {k.name: k.external_id for k in prof.trace.activities_of(ActivityKind.KERNEL)} == {
        "a": ann["outer"],
        "b": ann["inner"],
    }
    spans = prof.trace.activities_of(ActivityKind.GPU_USER_ANNOTATION)
    assert sorted(s.name for s in spans) == ["inner", "outer"]


def test_records_from_several_threads(pti):
    def work():
        ts = [threading.Thread(target=pti.kernel, args=(f"k{i}",), kwargs={"queue": i}) for i in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    trace = profile(work)
    assert len(trace.activities_of(ActivityKind.KERNEL)) == 3
    assert len({r.resource for r in trace.activities_of(ActivityKind.RUNTIME)}) == 3


def test_buffers_beyond_the_cap_are_refused_and_counted(pti):
    opts = {"xpu": {"buffer_kb": 1, "max_buffers": 1}}
    with pytest.warns(polyprof.PolyprofWarning, match="buffers refused"):
        trace = profile(lambda: [pti.kernel(f"k{i}") for i in range(40)], backend_options=opts)
    dropped = trace.backends["xpu"].dropped
    assert dropped.get("buffers refused (cap of 1)", 0) >= 1
    assert 0 < len(trace.activities_of(ActivityKind.KERNEL)) < 40


def test_a_buffer_delivered_after_stop_is_harmless(pti):
    pti.lib.fakePtiSetLateDelivery(150)
    with polyprof.profile(["cpu", "xpu"], registry=fresh_registry()) as prof:
        for i in range(3):
            pti.kernel(f"k{i}")
    time.sleep(0.4)  # the late buffer arrives now, after collect and close
    assert prof.trace.backends["xpu"].state == "ran" and not prof.trace.backends["xpu"].errors
    with polyprof.profile(["cpu", "xpu"], registry=fresh_registry()) as again:
        pti.lib.fakePtiSetLateDelivery(0)
        pti.kernel("next")
    assert [k.name for k in again.trace.activities_of(ActivityKind.KERNEL)] == ["next"], (
        "no stale records leak in"
    )


@pytest.mark.parametrize(
    "code,match", [("2", "PTI_ERROR_NOT_IMPLEMENTED"), ("51", "ZE_ENABLE_TRACING_LAYER=1")]
)
def test_unavailable_reasons(pti, monkeypatch, code, match):
    monkeypatch.setenv("FAKE_PTI_UNAVAILABLE", code)
    avail = XpuBackend().probe()
    assert not avail.available and match in avail.reason


def test_conformance_kit_through_the_double(pti):
    report = assert_conforms(
        XpuBackend(), workload=lambda: (pti.copy(), pti.kernel("k")), require_activities=True
    )
    assert report.activities >= 4


def test_options_are_checked():
    for options, match in (
        ({"views": ["kernels"]}, "unsupported item.*kernels"),
        ({"buffer_kb": 0}, "positive"),
        ({"runtime_apis": "few"}, "runtime_apis"),
        ({"x": 1}, "unknown option"),
    ):
        with pytest.raises(polyprof.ConfigError, match=match):
            XpuBackend().options.check("xpu", options)


def _real_wheel():
    import glob

    return glob.glob(os.path.join(sys.prefix, "lib", "libpti_view.so*"))


@pytest.mark.skipif(not _real_wheel(), reason="needs the intel-pti wheel (pip install --no-deps intel-pti)")
def test_real_intel_pti_wheel_says_why_it_cannot_run_here(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("POLYPROF_PTI_LIBRARY", "FAKE_PTI_UNAVAILABLE")}
    r = subprocess.run(
        [sys.executable, "-m", "polyprof", "backends"], capture_output=True, text=True, env=env
    )
    line = " ".join(r.stdout.split())
    assert "xpu" in line and "unavailable" in line and "PTI 1." in line
    assert "PTI_ERROR_NOT_IMPLEMENTED" in line and (
        "libxptifw" in line or "ze_loader" in line or "Level Zero" in line
    )
    script = tmp_path / "s.py"
    script.write_text("import polyprof\nwith polyprof.record_function('x'):\n    print('ran')\n")

    def run(activities):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "polyprof",
                "run",
                "--activities",
                activities,
                "-o",
                str(tmp_path / "t.json"),
                str(script),
            ],
            capture_output=True,
            text=True,
            env=env,
        )

    r = run("cpu,xpu")
    assert r.returncode == 2 and "activity XPU cannot be profiled here" in r.stderr
    assert "PTI_ERROR_NOT_IMPLEMENTED" in r.stderr
    r = run("cpu")
    assert r.returncode == 0 and "ran" in r.stdout
