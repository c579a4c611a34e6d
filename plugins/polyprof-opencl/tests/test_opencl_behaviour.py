import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import polyprof
from polyprof.model import ActivityKind
from polyprof.testing import assert_conforms

POLYPROF = [sys.executable, "-m", "polyprof"]


def _what_was_recorded(trace) -> str:
    """For a failed assertion: every activity, and what the backends reported."""
    return f"activities: {[(a.kind.name, a.name, a.args) for a in trace.activities]}; backends: {trace.backends}"


def test_device_index_that_does_not_exist_is_an_error_listing_devices(cl):
    with pytest.raises(polyprof.ConfigError) as err:
        polyprof.profile(["cpu", "opencl"], backend_options={"opencl": {"devices": [42]}})
    assert "device index 42 does not exist" in str(err.value) and "[0] " in str(err.value)
    with pytest.raises(polyprof.ConfigError, match="unknown option"):
        polyprof.profile(["opencl"], backend_options={"opencl": {"device": 0}})


def test_failed_enqueue_raises_pyopencls_error_and_keeps_what_came_before(cl, context, program):
    queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 * 4)
    add_one = program.add_one
    with polyprof.profile(["cpu", "opencl"]) as prof:
        add_one(queue, (64,), None, buf)
        with pytest.raises(cl.Error) as err:
            add_one(queue, (64,), (7,), buf)  # 64 is not a multiple of the local size 7
        assert "INVALID" in str(err.value)
        queue.finish()
    kernels = prof.trace.activities_of(ActivityKind.KERNEL)
    assert len(kernels) == 1
    failed = [a for a in prof.trace.activities_of(ActivityKind.RUNTIME) if "error" in a.args]
    assert len(failed) == 1 and "INVALID" in failed[0].args["error"] and failed[0].flow_id == 0


def test_queue_created_before_the_profile_is_warned_about_once_and_not_dropped_silently(cl, context, program):
    old_queue = cl.CommandQueue(context)  # no PROFILING_ENABLE: created before profiling
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 * 4)
    add_one = program.add_one
    with pytest.warns(polyprof.PolyprofWarning) as record:
        with polyprof.profile(["cpu", "opencl"]) as prof:
            for _ in range(3):
                add_one(old_queue, (64,), None, buf)
            old_queue.finish()
    messages = [str(w.message) for w in record if "was created without PROFILING_ENABLE" in str(w.message)]
    assert len(messages) == 1 and "its 3 command(s) appear as enqueue calls only" in messages[0]
    assert any("dropped 3 device records (queue without PROFILING_ENABLE)" in str(w.message) for w in record)
    trace = prof.trace
    assert len(trace.activities_of(ActivityKind.RUNTIME)) == 3
    assert trace.activities_of(ActivityKind.KERNEL) == []
    assert trace.backends["opencl"].dropped["device records (queue without PROFILING_ENABLE)"] == 3


def test_enable_queue_profiling_makes_earlier_queues_timed(cl, context, program):
    import polyprof_opencl

    polyprof_opencl.enable_queue_profiling()
    try:
        early_queue = cl.CommandQueue(context)
    finally:
        polyprof_opencl.disable_queue_profiling()
    assert early_queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    assert cl.CommandQueue is cl._cl.CommandQueue
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", polyprof.PolyprofWarning)
        with polyprof.profile(["opencl"]) as prof:
            program.add_one(early_queue, (64,), None, buf)
            early_queue.finish()
    assert len(prof.trace.activities_of(ActivityKind.KERNEL)) == 1, _what_was_recorded(prof.trace)


def test_commands_from_several_queues_and_threads_land_on_their_rows(cl, context, program):
    import threading

    add_one = program.add_one
    with polyprof.profile(["cpu", "opencl"]) as prof:
        queues = [cl.CommandQueue(context) for _ in range(2)]
        bufs = [cl.Buffer(context, cl.mem_flags.READ_WRITE, 256) for _ in range(2)]

        def work(i):
            k = cl.Kernel(add_one.program, "add_one")
            for _ in range(3):
                k(queues[i], (64,), None, bufs[i])
            queues[i].finish()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    trace = prof.trace
    kernels = trace.activities_of(ActivityKind.KERNEL)
    assert len(kernels) == 6
    rows = {trace.resources[k.resource].name for k in kernels}
    assert rows == {"queue 1", "queue 2"}  # numbered from 1: tid 0 is a process row to Perfetto
    launch_threads = {a.resource for a in trace.activities_of(ActivityKind.RUNTIME)}
    assert len(launch_threads) == 2


def test_opencl_backend_passes_the_conformance_kit(cl, context, program):
    def workload():
        queue = cl.CommandQueue(context)
        buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 1024)
        cl.enqueue_copy(queue, buf, np.zeros(256, np.float32))
        program.add_one(queue, (256,), None, buf)
        queue.finish()

    from polyprof_opencl import backend

    report = assert_conforms(backend, workload=workload, require_activities=True)
    assert report.activities == 4


def run_cli(args, **env):
    return subprocess.run(
        [*POLYPROF, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


def test_without_the_plugin_backends_says_nothing_of_opencl_and_a_profile_asking_for_it_fails_clearly(
    tmp_path,
):
    r = run_cli(["backends"], POLYPROF_DISABLED_BACKENDS="opencl")
    assert r.returncode == 0 and "opencl" not in r.stdout
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    r = run_cli(
        ["run", "--activities", "cpu,opencl", "-o", str(tmp_path / "t.json"), str(script)],
        POLYPROF_DISABLED_BACKENDS="opencl",
    )
    assert r.returncode == 2 and "ran" not in r.stdout
    assert "polyprof-opencl, which is not installed" in r.stderr
    r = run_cli(
        ["run", "--activities", "cpu", "-o", str(tmp_path / "t.json"), str(script)],
        POLYPROF_DISABLED_BACKENDS="opencl",
    )
    assert r.returncode == 0 and "ran" in r.stdout


def test_without_pyopencl_the_backend_is_unavailable_with_the_reason(tmp_path):
    (tmp_path / "pyopencl").mkdir()
    (tmp_path / "pyopencl" / "__init__.py").write_text(
        "raise ImportError('libOpenCL.so.1: cannot open shared object file')\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    r = run_cli(["backends"], **env)
    line = " ".join(r.stdout.split())
    assert "opencl" in line and "unavailable" in line and "pyopencl cannot be imported" in line
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    r = run_cli(["run", "--activities", "cpu,opencl", "-o", str(tmp_path / "t.json"), str(script)], **env)
    assert (
        r.returncode == 2
        and "activity OPENCL cannot be profiled here" in r.stderr
        and "libOpenCL.so.1" in r.stderr
    )
    r = run_cli(
        ["run", "-o", str(tmp_path / "t.json"), str(script)], **env
    )  # default activities: runs without it
    assert r.returncode == 0 and "ran" in r.stdout


def test_no_platform_reason(monkeypatch):
    import polyprof_opencl.opencl_backend as b

    class FakeCL:
        VERSION_TEXT = "x"

        @staticmethod
        def get_platforms():
            raise RuntimeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(b, "_import_pyopencl", lambda: FakeCL)
    avail = b.OpenCLBackend().probe()
    assert not avail.available and "ICD loader found no platform" in avail.reason and "pocl" in avail.reason


def test_example_runs_under_polyprof_run(tmp_path, cl):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = tmp_path / "t.json"
    r = run_cli(
        [
            "run",
            "--activities",
            "cpu,opencl",
            "-o",
            str(out),
            os.path.join(root, "examples", "opencl_vector_add.py"),
            "4096",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert "vector_add result" in r.stdout and "vector_add" in r.stderr and "gpu_memcpy" in r.stderr


def test_profiling_does_not_keep_host_arrays_alive_or_change_blocking(cl, context):
    """pyopencl's NannyEvent keeps the host array of a non-blocking transfer alive, and waits for the
    transfer when dropped; the profiler must not hold on to it."""
    import gc
    import weakref

    queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 4096 * 4)
    with polyprof.profile(["opencl"]) as prof:
        host = np.ones(4096, np.float32)
        ref = weakref.ref(host)
        cl.enqueue_copy(queue, buf, host, is_blocking=False)  # the returned NannyEvent is dropped at once
        del host
        gc.collect()
        assert ref() is None, "the profiler kept the host array alive"
        queue.finish()
    (copy,) = prof.trace.activities_of(ActivityKind.GPU_MEMCPY)
    assert copy.args["bytes"] == 4096 * 4 and copy.duration > 0


@pytest.mark.parametrize("created_at", ["wait", "warm-up", "active"])
def test_queues_created_at_any_step_of_a_scheduled_profile_are_timed(cl, context, program, created_at):
    from polyprof.profiler import ProfilerActivity, profile, schedule

    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 * 4)
    add_one = program.add_one
    create_at_step = {"wait": 0, "warm-up": 1, "active": 2}[created_at]
    queue = None
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.OPENCL], schedule=schedule(wait=1, warmup=1, active=3)
    ) as prof:
        for step in range(5):
            if step == create_at_step:
                queue = cl.CommandQueue(context)  # no properties: the profile makes it timed
            if queue is not None:
                # each kernel well inside its step: the marker clock maps device times to within 10-60 us
                # here, and a kernel mapped past an edge of the window is dropped as outside it
                time.sleep(0.002)
                add_one(queue, (64,), None, buf)
                queue.finish()
                time.sleep(0.002)
            prof.step()
    kernels = prof.trace.activities_of(ActivityKind.KERNEL)
    assert len(kernels) == 3, _what_was_recorded(prof.trace)  # the kernel of each active step, timed
    assert "device records (queue without PROFILING_ENABLE)" not in prof.trace.backends["opencl"].dropped
    after = cl.CommandQueue(context)  # after the profile: pyopencl's own class again
    assert not after.properties & cl.command_queue_properties.PROFILING_ENABLE


def test_device_rows_are_numbered_from_one_and_copies_named_for_hta(cl, context):
    a = np.arange(64, dtype=np.float32)
    with polyprof.profile(["cpu", "opencl"]) as prof:
        queue = cl.CommandQueue(context)
        buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, a.nbytes)
        cl.enqueue_copy(queue, buf, a)
        cl.enqueue_fill_buffer(queue, buf, np.float32(1), 0, a.nbytes)
        mapped, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ, 0, a.shape, a.dtype)
        mapped.base.release(queue)
        queue.finish()
    trace = prof.trace
    rows = [a for a in trace.activities if a.kind in (ActivityKind.GPU_MEMCPY, ActivityKind.GPU_MEMSET)]
    assert {a.name for a in rows} >= {"Memcpy HtoD (Host -> Device)", "Memset (Fill)", "Memcpy Map", "Memcpy Unmap"}
    assert all(a.name.startswith(("Memcpy", "Memset")) for a in rows)  # HTA types these as memory
    assert {trace.resources[a.resource].id for a in rows} == {1} and {a.args["stream"] for a in rows} == {1}


def test_a_profiles_start_reuses_the_wrappers_and_loader_lookup_of_earlier_profiles(cl, context, program):
    """The wrappers and clRetainEvent's address are made once a process: a start that rebuilt them made
    ~100 objects and a new ctypes type (a CDLL of the loader) every time."""
    from polyprof_opencl import intercept

    queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 64 * 4)
    host = np.ones(64, np.float32)
    wrappers, copies = [], []
    for n in range(2):
        with polyprof.profile(["opencl"]) as prof:
            wrappers.append((cl._cl.enqueue_nd_range_kernel, cl.enqueue_copy))
            program.add_one(queue, (64,), None, buf)
            cl.enqueue_copy(queue, buf, host, is_blocking=False).wait()
            queue.finish()
        if n == 0:
            assert intercept.cl_retain_event_address() != 0, "PoCL's loader has clRetainEvent"
            lookups = intercept.cl_retain_event_address.cache_info().misses
        assert len(prof.trace.activities_of(ActivityKind.KERNEL)) == 1, _what_was_recorded(prof.trace)
        copies.append(prof.trace.activities_of(ActivityKind.GPU_MEMCPY))
    assert intercept.cl_retain_event_address.cache_info().misses == lookups, "clRetainEvent looked up again"
    assert wrappers[0][0] is wrappers[1][0] and wrappers[0][1] is wrappers[1][1], "the same wrappers"
    assert wrappers[0][0] is not cl._cl.enqueue_nd_range_kernel, "and pyopencl's own function after the profile"
    assert [len(c) for c in copies] == [1, 1] and all(c[0].args["bytes"] == 256 for c in copies)
