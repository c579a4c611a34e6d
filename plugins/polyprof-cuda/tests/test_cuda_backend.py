"""polyprof-cuda without a GPU: records -> activities, flows, External ids, clocks, availability.

The CUPTI layer is replaced by RecordedLayer (recorded_cupti.py), which produces real cupti-python
record objects. Not exercised here: libcupti itself, the driver, real buffers and timing (see
scripts/device-check.py, to be run on a GPU machine).
"""

import threading

import pytest
from polyprof_cuda import CudaBackend
from polyprof_cuda.records import (
    DRIVER,
    EXTERNAL,
    FIELDS,
    KERNEL,
    MEMCPY,
    MEMCPY_P2P,
    MEMSET,
    OPTIONAL_FIELDS,
    OVERHEAD,
    RUNTIME,
    SYNC,
)
from recorded_cupti import RecordedLayer, dtype_name, latest_class, layout_dtype, make_record, stub_fields

import polyprof
from polyprof.engine.registry import Registry
from polyprof.model import ActivityKind
from polyprof.testing import assert_conforms


def registry_with(layer):
    reg = Registry(use_env=False)
    reg.register(CudaBackend(layer_factory=lambda: layer))
    return reg


def profile(layer, workload, activities=("cpu", "cuda"), **kw):
    with polyprof.profile(list(activities), registry=registry_with(layer), **kw) as prof:
        workload()
    return prof.trace


def test_every_layout_has_the_fields_read_and_a_numpy_dtype_for_them():
    """Every record layout a cupti-python 13 release may deliver for a family (the newest depends on
    libcupti) declares the fields decode() reads, in cupti.pyi and in the layout's published dtype."""
    import re

    from cupti import cupti

    fields = stub_fields()
    families = {
        KERNEL: r"ActivityKernel\d+",
        MEMCPY: r"ActivityMemcpy\d+",
        MEMCPY_P2P: r"ActivityMemcpyPtoP\d+",
        MEMSET: r"ActivityMemset\d+",
        RUNTIME: "ActivityAPI",
        DRIVER: "ActivityAPI",
        SYNC: r"ActivitySynchronization\d*",
        OVERHEAD: r"ActivityOverhead\d+",
        EXTERNAL: "ActivityExternalCorrelation",
    }
    assert set(families) == set(FIELDS)
    for family, pattern in families.items():
        layouts = [cls for cls in fields if re.fullmatch(pattern, cls)]
        assert layouts, f"no {pattern} in cupti.pyi"
        for cls in layouts:
            required = set(FIELDS[family]) - OPTIONAL_FIELDS
            assert not required - fields[cls], f"{family}: {cls} lacks {sorted(required - fields[cls])}"
            dtype = layout_dtype(cupti, getattr(cupti, cls))
            assert dtype is not None, f"cupti-python publishes no {dtype_name(cls)}"
            assert not required - set(dtype.names), (
                f"{dtype_name(cls)} lacks {sorted(required - set(dtype.names))}"
            )


def test_kernels_copies_fills_syncs_and_their_launches(tmp_path):
    layer = RecordedLayer()

    def work():
        with polyprof.record_function("step"):
            layer.memcpy("HTOD")
            layer.launch_kernel("gemm_kernel")
            layer.launch_kernel("relu_kernel", stream=8)
            layer.memset()
            layer.memcpy("DTOH")
            layer.synchronize()
            layer.uninteresting_api()

    trace = profile(layer, work)
    kernels = trace.activities_of(ActivityKind.KERNEL)
    copies = trace.activities_of(ActivityKind.GPU_MEMCPY)
    fills = trace.activities_of(ActivityKind.GPU_MEMSET)
    runtime = trace.activities_of(ActivityKind.RUNTIME)
    syncs = trace.activities_of(ActivityKind.SYNC)
    assert sorted(k.name for k in kernels) == ["gemm_kernel", "relu_kernel"]
    assert sorted(c.name for c in copies) == [
        "Memcpy DtoH (Device -> Pinned)",
        "Memcpy HtoD (Pageable -> Device)",
    ]
    assert [f.name for f in fills] == ["Memset (Device)"]
    assert [s.name for s in syncs] == ["Stream Sync"] and syncs[0].cat == "cuda_sync"
    assert {r.name for r in runtime} == {
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "cudaStreamSynchronize",
    }, "non-launch, non-copy, non-sync calls are filtered by default"
    gemm = next(k for k in kernels if k.name == "gemm_kernel")
    assert gemm.cat == "kernel"
    assert {
        k: gemm.args[k]
        for k in ("device", "context", "stream", "registers per thread", "shared memory", "grid", "block")
    } == {
        "device": 0,
        "context": 1,
        "stream": 7,
        "registers per thread": 32,
        "shared memory": 1024,
        "grid": (64, 1, 1),
        "block": (128, 1, 1),
    }
    import json

    from polyprof.formats import dumps_chrome_trace

    exported = json.loads(dumps_chrome_trace(trace))["traceEvents"]
    gemm_json = next(e for e in exported if e.get("name") == "gemm_kernel")
    assert gemm_json["args"]["grid"] == [64, 1, 1] and gemm_json["args"]["block"] == [128, 1, 1]
    assert copies[0].args["bytes"] == 1 << 20 and copies[0].args["memory bandwidth (GB/s)"] == pytest.approx(
        (1 << 20) / 100_000
    )
    # devices and streams as Kineto lays them out
    gpu0 = trace.device_by_key("cuda:0")
    assert gpu0.pid == 0 and gpu0.name == "Fake GPU 0" and gpu0.properties["numSms"] == 132
    rows = {trace.resources[k.resource].name for k in kernels}
    assert rows == {"stream 7", "stream 8"}
    assert trace.resources[syncs[0].resource].name == "stream 7 (sync)"
    # every device activity has an ac2g flow from its launch, and the annotation's External id
    launches = {r.flow_id: r for r in runtime if r.flow_start}
    step = trace.activities_of(ActivityKind.USER_ANNOTATION)[0]
    for a in kernels + copies + fills:
        assert a.flow_id in launches
        assert launches[a.flow_id].external_id == a.external_id == step.correlation
    assert launches[gemm.flow_id].name == "cudaLaunchKernel"


def test_queued_is_the_wait_before_the_kernel_ran_and_0_when_cupti_did_not_record_it():
    layer = RecordedLayer()

    def work():
        layer.launch_kernel("timed")
        layer.launch_kernel("unknown", queued=2**64 - 1)  # CUPTI_TIMESTAMP_UNKNOWN

    trace = profile(layer, work, backend_options={"cuda": {"latency_timestamps": True}})
    queued = {k.name: k.args["queued"] for k in trace.activities_of(ActivityKind.KERNEL)}
    assert queued == {"timed": 4.0, "unknown": 0.0}, "start is 5 us after the call, queued 1 us after"
    trace = profile(layer, lambda: layer.launch_kernel("off", queued=2**64 - 1))
    assert [k.args["queued"] for k in trace.activities_of(ActivityKind.KERNEL)] == [0]


def test_a_context_sync_without_a_stream_lands_on_the_stream_0_sync_row():
    layer = RecordedLayer()

    def work():
        layer.launch_kernel()
        layer.synchronize(stream=0xFFFFFFFF, sync_type="CONTEXT_SYNCHRONIZE")  # no stream, no event

    trace = profile(layer, work)
    (sync,) = trace.activities_of(ActivityKind.SYNC)
    assert sync.name == "Context Sync" and trace.resources[sync.resource].name == "stream 0 (sync)"
    assert sync.args["stream"] == -1 and sync.args["wait_on_cuda_event_id"] == 0


def test_all_apis_option_keeps_every_runtime_call():
    layer = RecordedLayer()
    trace = profile(
        layer,
        lambda: (layer.uninteresting_api(), layer.launch_kernel()),
        backend_options={"cuda": {"apis": "all"}},
    )
    assert {r.name for r in trace.activities_of(ActivityKind.RUNTIME)} == {
        "cudaGetDevice",
        "cudaLaunchKernel",
    }


def test_driver_launches_are_linked_like_runtime_ones():
    layer = RecordedLayer()
    trace = profile(layer, lambda: layer.launch_kernel("triton_kernel", driver=True))
    (drv,) = trace.activities_of(ActivityKind.DRIVER)
    (k,) = trace.activities_of(ActivityKind.KERNEL)
    assert drv.name == "cuLaunchKernel" and drv.cat == "cuda_driver" and drv.flow_id == k.flow_id != 0


def test_graph_launch_links_one_call_to_all_its_kernels():
    layer = RecordedLayer()
    trace = profile(layer, lambda: layer.graph_launch(nodes=3))
    kernels = trace.activities_of(ActivityKind.KERNEL)
    (launch,) = [r for r in trace.activities_of(ActivityKind.RUNTIME) if r.name == "cudaGraphLaunch"]
    assert len(kernels) == 3 and all(k.flow_id == launch.flow_id for k in kernels)
    assert [k.args["graph node id"] for k in kernels] == [100, 101, 102] and kernels[0].args["graph id"] == 5


def test_clock_mapping_removes_offset_and_drift_and_is_recorded():
    layer = RecordedLayer(offset_ns=7_000_000_000, drift_ppm=50)
    trace = profile(layer, lambda: [layer.launch_kernel() for _ in range(5)])
    clock = trace.backends["cuda"].clock["cupti"]
    assert clock["pairs"] >= 3 and clock["offset_ns"] == pytest.approx(-7_000_000_000, abs=1_000_000)
    w0, w1 = trace.window
    launches = {r.flow_id: r for r in trace.activities_of(ActivityKind.RUNTIME)}
    for k in trace.activities_of(ActivityKind.KERNEL):
        assert w0 <= k.start <= w1 + 100_000
        assert k.start >= launches[k.flow_id].start, "device work starts after its launch once aligned"


def test_external_ids_prefer_the_op_over_the_annotation_and_push_pop_stay_balanced():
    layer = RecordedLayer()
    reg = registry_with(layer)
    with polyprof.profile(["cpu", "cuda"], registry=reg) as prof:
        with polyprof.record_function("outer"):
            layer.launch_kernel("a")
            with polyprof.record_function("inner"):
                layer.launch_kernel("b")
    assert layer.external_stacks() == {"op": [], "annotation": []}
    ann = {a.name: a.correlation for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)}
    kernels = {k.name: k.external_id for k in prof.trace.activities_of(ActivityKind.KERNEL)}
    assert kernels == {"a": ann["outer"], "b": ann["inner"]}


def test_gpu_user_annotation_spans_cover_the_annotations_kernels():
    layer = RecordedLayer()

    def work():
        with polyprof.record_function("forward"):
            layer.launch_kernel("k1", stream=7)
            layer.launch_kernel("k2", stream=7)
            layer.launch_kernel("k3", stream=8)

    trace = profile(layer, work)
    spans = trace.activities_of(ActivityKind.GPU_USER_ANNOTATION)
    assert sorted((s.name, trace.resources[s.resource].name) for s in spans) == [
        ("forward", "stream 7"),
        ("forward", "stream 8"),
    ]
    k = {x.name: x for x in trace.activities_of(ActivityKind.KERNEL)}
    s7 = next(s for s in spans if trace.resources[s.resource].name == "stream 7")
    assert s7.start == k["k1"].start and s7.end == k["k2"].end and s7.cat == "gpu_user_annotation"


def test_dropped_records_are_counted_and_warned():
    layer = RecordedLayer(dropped=42)
    with pytest.warns(polyprof.PolyprofWarning, match="dropped 42 records"):
        trace = profile(layer, lambda: layer.launch_kernel())
    assert trace.backends["cuda"].dropped["records (CUPTI buffers full)"] == 42


def test_record_cap_drops_and_counts_the_excess():
    layer = RecordedLayer()
    with pytest.warns(polyprof.PolyprofWarning, match="over the cap of 3"):
        trace = profile(
            layer,
            lambda: [layer.launch_kernel() for _ in range(5)],
            backend_options={"cuda": {"max_records": 3}},
        )
    assert trace.backends["cuda"].dropped["records over the cap of 3"] == 7


def test_buffers_delivered_on_cuptis_thread_and_after_stop_are_kept():
    layer = RecordedLayer(deliver_late=True)
    trace = profile(layer, lambda: [layer.launch_kernel(f"k{i}") for i in range(6)])
    assert len(trace.activities_of(ActivityKind.KERNEL)) == 6


def test_another_cupti_subscriber_is_a_clear_failure_that_spares_the_rest():
    layer = RecordedLayer(subscriber="torch.profiler (Kineto)")
    with pytest.warns(
        polyprof.PolyprofWarning, match=r"another CUPTI subscriber is attached \(torch.profiler \(Kineto\)\)"
    ):
        with polyprof.profile(["cpu", "cuda"], registry=registry_with(layer)) as prof:
            with polyprof.record_function("still recorded"):
                layer.launch_kernel()
    assert prof.trace.backends["cuda"].state == "failed"
    assert [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)] == ["still recorded"]


@pytest.mark.parametrize(
    "error, says",
    [
        ("ERROR_NOT_INITIALIZED", r"libcupti .* needs a driver at least as new .* supports CUDA 13\.0"),
        ("ERROR_INSUFFICIENT_PRIVILEGES", r"may not profile the GPU .*NVreg_RestrictProfilingToAdminUsers"),
        ("ERROR_UNKNOWN", None),
    ],
)
def test_cupti_refusing_to_trace_here_is_explained(error, says):
    layer = RecordedLayer(subscribe_error=error)
    reg = registry_with(layer)
    if says is None:  # an error that says nothing about tracing: the probe gives up, tracing goes on
        with polyprof.profile(["cpu", "cuda"], registry=reg) as prof:
            layer.launch_kernel()
        assert prof.trace.backends["cuda"].state == "ran"
        assert len(prof.trace.activities_of(ActivityKind.KERNEL)) == 1
        return
    with pytest.warns(polyprof.PolyprofWarning, match=says):
        with polyprof.profile(["cpu", "cuda"], registry=reg) as prof:
            layer.launch_kernel()
    assert prof.trace.backends["cuda"].state == "failed"


def test_the_subscriber_probe_names_polyprof_and_frees_the_slot():
    """cuptiSubscribe_v2 needs the params' structSize; without it CUPTI refuses every call and the
    probe would learn nothing."""
    layer = RecordedLayer()
    profile(layer, layer.launch_kernel)
    assert layer.c.subscriber_names == ["polyprof"] and layer.c.subscribers == set()


def test_unavailable_reasons_from_the_real_bindings():
    avail = CudaBackend().probe()  # the real CuptiLayer on a machine without an NVIDIA driver
    assert not avail.available
    assert "no NVIDIA driver" in avail.reason or "cupti" in avail.reason.lower()
    with pytest.raises(
        polyprof.BackendUnavailableError, match="activity CUDA cannot be profiled here: cuda: "
    ):
        polyprof.profile(["cpu", "cuda"])


def test_unavailable_when_cupti_python_is_missing(monkeypatch):
    import sys

    from polyprof_cuda.cupti_layer import CuptiLayer

    monkeypatch.setitem(sys.modules, "cupti", None)
    with pytest.raises(Exception, match="cupti-python cannot be imported.*polyprof-cuda\\[cu13\\]"):
        CuptiLayer()
    assert "cupti-python cannot be imported" in CudaBackend().probe().reason


def test_options_are_checked_before_anything_starts():
    layer = RecordedLayer()
    reg = registry_with(layer)
    for options, match in (
        ({"kinds": ["KERNAL"]}, "unsupported item.*KERNAL.*supported: .*KERNEL"),
        ({"apis": "some"}, "'apis' must be"),
        ({"max_records": 0}, "positive integer"),
        ({"preallocate_device_buffers": -1}, "integer >= 0"),
        ({"nope": 1}, "unknown option"),
    ):
        with pytest.raises(polyprof.ConfigError, match=match):
            polyprof.profile(["cuda"], registry=reg, backend_options={"cuda": options})


def test_cupti_buffers_are_preallocated_before_tracing_is_enabled():
    """Kineto issue #1020: buffers CUPTI allocates inside the traced window stall launches."""
    layer = RecordedLayer()
    profile(layer, layer.launch_kernel)
    assert layer.preallocated == (2, 2, []), "set before any activity kind is enabled"
    layer = RecordedLayer()
    profile(layer, layer.launch_kernel, backend_options={"cuda": {"preallocate_device_buffers": 0}})
    assert layer.preallocated[:2] == (0, 2)


def test_a_refused_preallocation_is_noted_per_attribute_and_tracing_goes_on():
    """An H200 with CUDA 13.0 refuses semaphore pre-allocation (ERROR_NOT_SUPPORTED): nothing the user
    can change, so it is a detail of the backend's status, not a warning on every run."""
    layer = RecordedLayer()
    layer.c.refuse_attributes = int(layer.c.Result.ERROR_NOT_SUPPORTED)
    trace = profile(layer, layer.launch_kernel)
    status = trace.backends["cuda"]
    assert status.state == "ran" and len(trace.activities_of(ActivityKind.KERNEL)) == 1
    assert not status.warnings
    for attribute in ("DEVICE_BUFFER_PRE_ALLOCATE_VALUE", "PROFILING_SEMAPHORE_PRE_ALLOCATE_VALUE"):
        assert "NOT_SUPPORTED" in status.details[f"CUPTI did not pre-allocate ({attribute})"]


def test_conformance_kit_with_recorded_cupti():
    layer = RecordedLayer()

    def workload():
        layer.memcpy()
        layer.launch_kernel()

    report = assert_conforms(
        CudaBackend(layer_factory=lambda: layer), workload=workload, require_activities=True
    )
    assert report.activities >= 4


def test_records_from_several_threads_land_on_their_threads():
    layer = RecordedLayer()

    def work():
        ts = [threading.Thread(target=layer.launch_kernel) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    trace = profile(layer, work)
    assert len({r.resource for r in trace.activities_of(ActivityKind.RUNTIME)}) == 3


def test_make_record_rejects_fields_the_stub_does_not_declare():
    with pytest.raises(AssertionError, match="no field"):
        make_record(latest_class("ActivityKernel"), gridx=1)


# -- beside torch's own profiler (Kineto) ---------------------------------------------------------
KINETO_SUBSCRIBER = "CUPTI for <not provided>"  # how CUPTI named torch's Kineto on an H200, torch 2.11


def test_an_idle_kineto_subscriber_does_not_stop_tracing():
    """Once torch's profiler has run, Kineto stays subscribed (unnamed) for the life of the process;
    while it traces nothing, polyprof traces and notes it."""
    pytest.importorskip("torch", reason="needs torch to tell Kineto's state")
    layer = RecordedLayer(subscriber=KINETO_SUBSCRIBER)
    trace = profile(layer, layer.launch_kernel)
    status = trace.backends["cuda"]
    assert status.state == "ran" and len(trace.activities_of(ActivityKind.KERNEL)) == 1
    assert status.details["CUPTI subscriber"] == "torch's profiler (idle) holds it; polyprof traces"


def test_a_running_torch_profiler_or_a_named_tool_still_refuses(monkeypatch):
    torch = pytest.importorskip("torch", reason="needs torch to tell Kineto's state")
    named = RecordedLayer(subscriber="Nsight Systems")
    with pytest.warns(
        polyprof.PolyprofWarning, match=r"another CUPTI subscriber is attached \(Nsight Systems\)"
    ):
        assert profile(named, named.launch_kernel).backends["cuda"].state == "failed"
    monkeypatch.setattr(torch._C._autograd, "_profiler_enabled", lambda: True)
    running = RecordedLayer(subscriber=KINETO_SUBSCRIBER)
    with pytest.warns(polyprof.PolyprofWarning, match="another CUPTI subscriber is attached"):
        assert profile(running, running.launch_kernel).backends["cuda"].state == "failed"


def test_beside_torchs_collector_cupti_is_taken_back_and_kinetos_external_ids_ignored():
    """with_stack=True with profile_memory=True records ops through torch's collector (its memory timeline
    walks torch's own event tree), which (on a CUDA machine) registers its own CUPTI buffer callbacks: the CUDA backend, started after it, registers again, and links launches to
    ops and annotations by time, not by the external ids Kineto pushes (they are Kineto's)."""
    pytest.importorskip("torch", reason="needs torch's collector")
    layer = RecordedLayer(subscriber=KINETO_SUBSCRIBER)
    custom0 = int(layer.c.real.ExternalCorrelationKind.CUSTOM0)

    def work():
        with polyprof.record_function("step"):
            layer.c.stacks.setdefault(custom0, []).append(424242)  # Kineto's id for some op
            layer.launch_kernel("k")
            layer.c.stacks[custom0].pop()

    trace = profile(layer, work, with_stack=True, profile_memory=True)
    status = trace.backends["cuda"]
    assert trace.backends["torch"].details["recorder"].startswith("torch collector")
    assert layer.c.raw.registrations == 2, "registered at prepare, and again after torch's collector started"
    assert "alongside" in status.details
    (kernel,) = trace.activities_of(ActivityKind.KERNEL)
    (step,) = [a for a in trace.activities_of(ActivityKind.USER_ANNOTATION) if a.name == "step"]
    assert kernel.external_id == step.correlation != 424242


def test_kinetos_external_ids_would_win_without_its_collector():
    """The same pushes without torch's collector are polyprof's own: the op kind (CUSTOM0) wins."""
    layer = RecordedLayer()
    custom0 = int(layer.c.real.ExternalCorrelationKind.CUSTOM0)

    def work():
        layer.c.stacks.setdefault(custom0, []).append(4242)
        layer.launch_kernel("k")
        layer.c.stacks[custom0].pop()

    (kernel,) = profile(layer, work).activities_of(ActivityKind.KERNEL)
    assert kernel.external_id == 4242


def test_the_stop_reports_cuptis_share_and_polyprofs_decoding_apart():
    layer = RecordedLayer()
    status = profile(layer, layer.launch_kernel).backends["cuda"]
    took = status.details["stop_ms"]
    assert set(took) == {"cupti_flush", "decode"} and all(v >= 0 for v in took.values())


def test_a_malformed_buffer_is_an_error_of_the_cuda_backend_alone(monkeypatch):
    layer = RecordedLayer()
    monkeypatch.setattr(layer.c.raw, "next_record", lambda buffer, valid, record: record - 8)  # backwards
    with pytest.warns(
        polyprof.PolyprofWarning, match="decoding CUPTI records failed: ValueError: the record walk"
    ):
        trace = profile(layer, layer.launch_kernel)
    assert trace.backends["cuda"].errors and not trace.activities_of(ActivityKind.KERNEL)
    assert trace.backends["host"].state == "ran"
