"""Issue #3 acceptance, on a real OpenCL device (PoCL's CPU device in CI)."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

import polyprof
from polyprof.formats import load_trace
from polyprof.model import ActivityKind
from polyprof.profiler import ProfilerActivity, profile

N_KERNELS, M_COPIES, K_FILLS = 7, 5, 3


def run_workload(cl, context, program, n=4096):
    queue = cl.CommandQueue(context)  # created inside the profile: made profiling-enabled
    host = np.arange(n, dtype=np.float32)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, host.nbytes)
    other = cl.Buffer(context, cl.mem_flags.READ_WRITE, host.nbytes)
    kernel_events = []
    add_one, busy = cl.Kernel(program, "add_one"), cl.Kernel(program, "busy")
    with polyprof.record_function("copies"):
        cl.enqueue_copy(queue, buf, host)  # HtoD
        cl.enqueue_copy(queue, other, buf)  # DtoD
        cl.enqueue_copy(queue, buf, other)  # DtoD
    with polyprof.record_function("fills"):
        for _ in range(K_FILLS - 1):
            cl.enqueue_fill_buffer(queue, other, np.float32(2), 0, host.nbytes)
    with polyprof.record_function("kernels"):
        for i in range(N_KERNELS):
            if i % 2:
                kernel_events.append(add_one(queue, (n,), None, buf))
            else:
                kernel_events.append(busy(queue, (n,), (64,), buf, np.int32(2000)))
    cl.enqueue_fill_buffer(queue, other, np.float32(0), 0, host.nbytes)
    out = np.empty_like(host)
    cl.enqueue_copy(queue, out, buf)  # DtoH
    cl.enqueue_copy(queue, host, other)  # DtoH
    queue.finish()
    return out, kernel_events


@pytest.fixture
def profiled(cl, context, program):
    assert ProfilerActivity.OPENCL == "OPENCL"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.OPENCL]) as prof:
        out, events = run_workload(cl, context, program)
        # CLOCK_MONOTONIC - CLOCK_MONOTONIC_RAW while the pairs are taken: the two run at rates NTP's
        # correction sets apart (tens of ppm), so read later in a loaded suite it has moved on
        raw_offset = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    return prof, out, events, raw_offset


def test_counts_of_kernels_copies_and_fills_each_with_a_flow_from_its_enqueue(profiled):
    prof = profiled[0]
    trace = prof.trace
    pocl = [d for d in trace.devices if d.type == "opencl"]
    assert len(pocl) == 1
    dev = trace.devices.index(pocl[0])
    by_kind = {
        k: [a for a in trace.activities_of(k) if a.device == dev]
        for k in (ActivityKind.KERNEL, ActivityKind.GPU_MEMCPY, ActivityKind.GPU_MEMSET)
    }
    assert len(by_kind[ActivityKind.KERNEL]) == N_KERNELS
    assert len(by_kind[ActivityKind.GPU_MEMCPY]) == M_COPIES
    assert len(by_kind[ActivityKind.GPU_MEMSET]) == K_FILLS
    launches = {a.flow_id: a for a in trace.activities_of(ActivityKind.RUNTIME) if a.flow_start}
    for rows in by_kind.values():
        for a in rows:
            launch = launches[a.flow_id]
            assert launch.cat == "opencl_runtime" and not a.flow_start
            assert a.external_id == launch.external_id
    names = {a.name for a in by_kind[ActivityKind.KERNEL]}
    assert names == {"add_one", "busy"}
    copies = sorted(a.args["direction"] for a in by_kind[ActivityKind.GPU_MEMCPY])
    assert copies == ["DtoD", "DtoD", "DtoH", "DtoH", "HtoD"]
    assert all(a.args["bytes"] == 4096 * 4 for a in by_kind[ActivityKind.GPU_MEMCPY])


def test_device_work_carries_the_enclosing_annotation(profiled):
    trace = profiled[0].trace
    ann = {a.name: a.correlation for a in trace.activities_of(ActivityKind.USER_ANNOTATION)}
    kernels = trace.activities_of(ActivityKind.KERNEL)
    assert {k.external_id for k in kernels} == {ann["kernels"]}


def test_aligned_device_times_follow_their_enqueue_and_durations_match_pyopencl(profiled):
    prof, _, events, _ = profiled
    trace = prof.trace
    clock = trace.backends["opencl"].clock["opencl:0"]
    tolerance = clock["residual_ns"] + clock["uncertainty_ns"]
    launches = {a.flow_id: a for a in trace.activities_of(ActivityKind.RUNTIME) if a.flow_start}
    device_rows = [
        a
        for a in trace.activities
        if a.kind in (ActivityKind.KERNEL, ActivityKind.GPU_MEMCPY, ActivityKind.GPU_MEMSET)
    ]
    for a in device_rows:
        assert a.start >= launches[a.flow_id].start - tolerance, (
            a.name,
            a.start - launches[a.flow_id].start,
            tolerance,
        )
    kernels = sorted(trace.activities_of(ActivityKind.KERNEL), key=lambda a: a.start)
    assert len(kernels) == len(events)
    for row, ev in zip(kernels, sorted(events, key=lambda e: e.profile.start), strict=True):
        theirs = ev.profile.end - ev.profile.start
        assert row.duration == pytest.approx(theirs, rel=0.01, abs=2)


def test_pocl_clock_is_not_the_host_clock_and_the_mapping_shows_it(profiled):
    clock = profiled[0].trace.backends["opencl"].clock["opencl:0"]
    expected = profiled[3]
    assert clock["pairs"] >= 2
    assert clock["method"] in ("marker", "device_and_host_timer")
    # PoCL stamps events with CLOCK_MONOTONIC_RAW; polyprof's clock is CLOCK_MONOTONIC
    assert abs(clock["offset_ns"] - expected) < clock["uncertainty_ns"] + clock["residual_ns"] + 100_000
    if abs(expected) > 1_000_000:
        assert abs(clock["offset_ns"]) > 1_000_000, "a real offset was found, not identity"


def test_program_results_are_unchanged_and_nothing_is_kept_alive(cl, context, program, profiled):
    out, _ = run_workload(cl, context, program)  # unprofiled run of the same work
    np.testing.assert_array_equal(profiled[1], out)
    from polyprof_opencl.intercept import patches, recorder

    assert recorder.holder[0] is None and not patches.installed
    assert not hasattr(cl._cl.enqueue_nd_range_kernel, "__polyprof_original__"), (
        "no wrapper outside a profile"
    )
    assert cl.CommandQueue is cl._cl.CommandQueue


def test_trace_loads_back_and_summary_shows_kernels_per_device(profiled, tmp_path):
    path = tmp_path / "ocl.json.gz"
    profiled[0].export_chrome_trace(str(path))
    back = load_trace(path)
    assert len(back.activities_of(ActivityKind.KERNEL)) == N_KERNELS
    r = subprocess.run(
        [sys.executable, "-m", "polyprof", "summary", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0
    assert "kernel" in r.stdout and "busy" in r.stdout and "add_one" in r.stdout
    device_line = next(line for line in r.stdout.splitlines() if "· kernel" in line)
    assert "pthread" in device_line or "OpenCL" in device_line or "·" in device_line
    doc = json.loads(__import__("gzip").decompress(path.read_bytes()))
    props = doc["deviceProperties"][0]
    assert {"name", "vendor", "version", "computeUnits", "totalGlobalMem"} <= set(props)
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert "queue 1" in threads
