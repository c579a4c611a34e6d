"""polyprof-rocm's rocprofiler-sdk backend against a compiled double of the SDK entry points it calls
(records laid out as the SDK's headers define them, delivered from the double's own thread), and the
availability reasons on this machine, which has no ROCm. Not exercised: rocprofiler-sdk on AMD hardware."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from polyprof_rocm import rocprofiler_abi as abi
from polyprof_rocm.rocprofiler_backend import RocprofilerBackend

import polyprof
from polyprof.engine.registry import Registry
from polyprof.model import FLOW_AC2G, ActivityKind
from polyprof.testing import assert_conforms


def fresh_registry():
    reg = Registry(use_env=False)
    reg.register(RocprofilerBackend())
    return reg


def profile(workload, **kw):
    with polyprof.profile(["cpu", "rocm"], registry=fresh_registry(), **kw) as prof:
        workload()
    return prof.trace


def test_ctypes_layouts_have_the_c_sizes(rocprof):
    for which, struct in enumerate((abi.ApiRecord, abi.MemoryCopyRecord, abi.KernelDispatchRecord, abi.CallbackRecord,
                                     abi.KernelSymbolRegister, abi.Agent, abi.RecordHeader)):
        assert ctypes.sizeof(struct) == rocprof.lib.fake_record_size(which), struct.__name__
    assert ctypes.sizeof(abi.KernelDispatchInfo) == 128, "the SDK's static_assert"


def test_probe_lists_the_gpus_and_the_version(rocprof):
    availability = RocprofilerBackend().probe()
    assert availability.available, availability.reason
    assert list(availability.devices) == ["GPU 0: AMD Instinct MI210", "GPU 1: AMD Instinct MI210"]


def test_kernels_copies_and_hip_calls_reach_the_timeline_with_flows_and_external_ids(rocprof):
    rocprof.load_kernel(7, "_Z4gemmPfS_i")  # loaded before the profile: its name is still known
    launched = {}

    def work():
        with polyprof.record_function("step"):
            launched["h2d"] = rocprof.memcpy(direction=2, nbytes=1 << 20)
            launched["gemm"] = rocprof.launch(7, gpu=0, queue=0x51)
            rocprof.load_kernel(8, "softmax_kernel")  # loaded while recording
            launched["softmax"] = rocprof.launch(8, gpu=1, queue=0x99)
            rocprof.call(4)  # hipGetDevice: no device work, not kept by default
            rocprof.call(3)  # hipDeviceSynchronize: kept
            launched["d2h"] = rocprof.memcpy(direction=3, nbytes=4096)
        launched["outside"] = rocprof.launch(7)  # after the annotation: no External id

    trace = profile(work)
    acts = list(trace.activities)
    step = next(a for a in acts if a.name == "step")
    kernels = {a.name: a for a in acts if a.kind == ActivityKind.KERNEL and a.correlation != launched["outside"]}
    assert set(kernels) == {"gemm(float*, float*, int)", "softmax_kernel"}, "names from code objects, demangled"
    copies = sorted(a.name for a in acts if a.kind == ActivityKind.GPU_MEMCPY)
    assert copies == ["Memcpy DtoH", "Memcpy HtoD"]
    runtime = [a for a in acts if a.kind == ActivityKind.RUNTIME]
    assert sorted(a.name for a in runtime) == sorted(
        ["hipMemcpyAsync", "hipLaunchKernel", "hipLaunchKernel", "hipDeviceSynchronize", "hipMemcpyAsync", "hipLaunchKernel"]
    )
    assert {a.cat for a in runtime} == {"cuda_runtime"}, "HIP calls as Kineto writes them"
    gemm, softmax = kernels["gemm(float*, float*, int)"], kernels["softmax_kernel"]
    assert gemm.external_id == softmax.external_id == step.correlation, "the pushed id of the annotation"
    devices = {d.key: d for d in trace.devices}
    assert {"rocm:0", "rocm:1"} <= set(devices)
    assert trace.devices[gemm.device].key == "rocm:0" and trace.devices[softmax.device].key == "rocm:1"
    assert devices["rocm:0"].properties["numSms"] == 104 and devices["rocm:0"].properties["warpSize"] == 64
    assert gemm.args["grid"] == [4, 2, 1] and gemm.args["block"] == [256, 1, 1]
    # every device activity has an ac2g flow from its HIP call; the call on the host thread row
    cols = trace.activities.columns
    device_rows = np.flatnonzero(np.isin(cols["kind"], [int(ActivityKind.KERNEL), int(ActivityKind.GPU_MEMCPY)]))
    for r in device_rows.tolist():
        fid = cols["flow_id"][r]
        assert fid and cols["flow_type"][r] == FLOW_AC2G
        starts = np.flatnonzero((cols["flow_id"] == fid) & (cols["flow_start"] != 0))
        assert len(starts) == 1 and cols["kind"][starts[0]] == int(ActivityKind.RUNTIME)
        assert cols["start"][starts[0]] <= cols["start"][r], "the launch before its work, on one clock"
    # the device clock (1000 s ahead in the double) mapped onto the host's
    assert step.start <= gemm.start <= step.end + 1_000_000
    status = trace.backends["rocm"]
    assert status.state == "ran" and "rocprofiler" in status.clock
    outside = next(a for a in acts if a.kind == ActivityKind.KERNEL and a.correlation == launched["outside"])
    assert outside.external_id != step.correlation


def test_all_runtime_apis_and_a_second_profile_in_the_same_process(rocprof):
    trace = profile(lambda: (rocprof.call(4), rocprof.launch(7)), backend_options={"rocm": {"runtime_apis": "all"}})
    assert "hipGetDevice" in {a.name for a in trace.activities}
    again = profile(lambda: rocprof.launch(7))
    assert [a.name for a in again.activities if a.kind == ActivityKind.KERNEL] == ["gemm(float*, float*, int)"]


def test_records_the_sdk_dropped_and_records_of_an_older_layout_are_counted_not_misread(rocprof):
    def work():
        rocprof.launch(7)
        rocprof.lib.fake_drop(3)

    trace = profile(work)
    assert trace.backends["rocm"].dropped.get("records (rocprofiler-sdk's buffer was full)") == 3
    rocprof.lib.fake_shrink_records(8)  # every record says it is 8 bytes shorter than transcribed
    trace = profile(lambda: rocprof.launch(7))
    assert not [a for a in trace.activities if a.kind == ActivityKind.KERNEL]
    dropped = trace.backends["rocm"].dropped
    assert dropped == {"hip_runtime records (a layout older than polyprof-rocm reads)": 1,
                       "kernel records (a layout older than polyprof-rocm reads)": 1}, dropped


def test_conformance_kit(rocprof):
    assert_conforms(RocprofilerBackend(), workload=lambda: rocprof.launch(7))


SCRIPT = r"""
import json, os
from polyprof_rocm.rocprofiler_backend import RocprofilerBackend
print(json.dumps(RocprofilerBackend().probe().reason))
"""


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"POLYPROF_ROCPROFILER_LIBRARY": "/nonexistent/librocprofiler-sdk.so", "ROCM_PATH": "/nonexistent"},
         "rocprofiler-sdk not found"),
        ({"FAKE_ROCPROFILER_VERSION": "0.4.0"}, "polyprof-rocm reads the record layouts of 0.5"),
        ({"FAKE_ROCPROFILER_GPUS": "0"}, "sees no AMD GPU"),
    ],
)
def test_unavailable_with_a_reason_a_user_can_act_on(fake_rocprofiler_path, env, reason):
    full = {**os.environ, "POLYPROF_ROCPROFILER_LIBRARY": fake_rocprofiler_path, **env}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, check=True)
    assert reason in r.stdout, r.stdout


def test_this_machine_has_no_rocm_and_says_so():
    env = {k: v for k, v in os.environ.items() if k != "POLYPROF_ROCPROFILER_LIBRARY"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
    if os.path.exists("/opt/rocm/lib"):
        pytest.skip("this machine has ROCm")
    assert "rocprofiler-sdk not found" in r.stdout and "install ROCm" in r.stdout
