"""scripts/device-check.py's analysis and report, checked here so that the scarce GPU run cannot fail on
them: trace_summary on a real polyprof trace (recorded CUPTI) and build_report on results of every shape
(all parts passing, parts failing, parts missing). The workloads themselves need a GPU."""

import importlib.util
import json
import os
from collections import Counter

import pytest
from polyprof_cuda import CudaBackend
from recorded_cupti import RecordedLayer

import polyprof
from polyprof.engine.registry import Registry

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "device-check.py")


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def roundtrip(result):
    """What the parent process reads from a part's stdout."""
    return json.loads(json.dumps(result, default=lambda o: dict(o) if isinstance(o, Counter) else str(o)))


def recorded_trace(tmp_path):
    layer = RecordedLayer()
    reg = Registry(use_env=False)
    reg.register(CudaBackend(layer_factory=lambda: layer))
    with polyprof.profile(["cpu", "cuda"], registry=reg) as prof:
        with polyprof.record_function("step"):
            layer.memcpy("HTOD")
            layer.launch_kernel("gemm")
            layer.launch_kernel("relu", driver=True)
            layer.memset()
        layer.launch_kernel("outside")
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def test_trace_summary_reads_polyprofs_export(check, tmp_path):
    s = check.trace_summary(recorded_trace(tmp_path))
    assert s["n_kernels"] == 3 and s["kernels"] == Counter({"gemm": 1, "relu": 1, "outside": 1})
    assert s["memcpy"] == 1 and s["memset"] == 1
    assert s["kernels_with_flow"] == 3, "runtime and driver launches both link to their kernels"
    assert s["kernels_charged_to_op"] == 0, "record_function is a user annotation, not an aten op"
    assert s["attribution"] == Counter({"step -> gemm": 1, "step -> relu": 1, "- -> outside": 1})


def test_trace_summary_charges_kernels_to_cpu_ops_as_torch_writes_them(check):
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "args": {"External id": 5}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": 9}},
            # the flow's id need not be the correlation id: its end binds to the slice at its pid/tid/ts
            {"ph": "s", "cat": "ac2g", "id": 11, "pid": 1, "tid": 1, "ts": 10},
            {"ph": "f", "cat": "ac2g", "id": 11, "pid": 0, "tid": 7, "ts": 20},
            {
                "ph": "X",
                "cat": "kernel",
                "name": "sgemm",
                "pid": 0,
                "tid": 7,
                "ts": 20,
                "args": {"External id": 5, "correlation": 9},
            },
            # an end without a start links nothing
            {"ph": "f", "cat": "ac2g", "id": 10, "pid": 0, "tid": 7, "ts": 30},
            {
                "ph": "X",
                "cat": "kernel",
                "name": "orphan",
                "pid": 0,
                "tid": 7,
                "ts": 30,
                "args": {"External id": 0, "correlation": 10},
            },
        ]
    }
    s = check.trace_summary(doc)
    assert s["kernels_charged_to_op"] == 1 and s["kernels_with_flow"] == 1
    assert s["attribution"] == Counter({"aten::mm -> sgemm": 1, "- -> orphan": 1})


def passing_results(check, tmp_path):
    summary = roundtrip(check.trace_summary(recorded_trace(tmp_path)))
    status = {"cuda": {"state": "ran"}}
    other = {**summary, "result_ok": True, "torch_imported": False}
    return {
        "env": {"python": "3.12.3", "cupti-python": "13.0.1", "backends": {"cuda": "available: [0] H200"}},
        "a_polyprof": {**summary, "backends": status},
        "a_torch": summary,
        "a_polyprof_collector": {**summary, "backends": status},
        "b_cupy": other,
        "b_numba": other,
        "b_cuda_python": other,
        "b_jax": {**other, "jax_devices": ["cuda:0"]},
        "b_triton": {**summary, "result_ok": True},
        "c_unprofiled": {"seconds": 0.05},
        "c_torch": {"seconds": 0.15, "stop_to_written_s": 0.4},
        "c_polyprof": {
            "seconds": 0.12,
            "stop_to_written_s": 0.05,
            "stop_s": 0.02,
            "n_kernels": 10000,
            "cuda_activities": 30000,
            "records_per_s_at_stop": 1.5e6,
            "cuda_status": {**status["cuda"], "details": {"stop_ms": {"cupti_flush": 1.0, "decode": 5.0}}},
            "postprocess_ms": {"cuda": {"stop": 6.0, "collect": 15.0}, "merge": 5.0},
        },
        "g_lightning_polyprof": {"traces": 1, "polyprof_traces": 1, "aten_ops": ["aten::mm"], "kernels": {"gemm": 4},
                                 "backends": status},
        "g_lightning_torch": {"traces": 1, "polyprof_traces": 0, "aten_ops": ["aten::mm"], "kernels": {"gemm": 4},
                              "backends": {}},
        "h_flight": {"oom_raised": True, "failures": [], "write_s": [0.2, 0.1],
                     "captures": {"slow_step": {"evidence": {"step": 30}, "kernels": 120, "rows": 900, "cuda": {}},
                                  "oom": {"evidence": {"device": 0}, "kernels": 80, "rows": 700, "cuda": {}}}},
        "x_stop_profile": {"postprocess_ms": {"merge": 5.0}, "profile": ["ncalls  tottime", "1 0.001 merge"]},
        "x_cuda_only_torch": {"seconds": 0.1},
        "c_interleaved": {
            "seconds": {
                "unprofiled": [0.1, 0.09, 0.11],
                "torch": [0.13, 0.12, 0.14],
                "polyprof": [0.11, 0.12, 0.1],
            },
            "stop_to_written_s": {"torch": [0.3, 0.2, 0.4], "polyprof": [0.1, 0.1, 0.2]},
        },
    }


def test_report_of_a_passing_run(check, tmp_path):
    report = check.build_report(passing_results(check, tmp_path))
    assert "kernel names identical (multiset): **True** (3 vs 3 kernels)" in report
    assert "attribution identical to torch.profiler's for **3/3** kernels" in report
    assert "overhead ratio polyprof/torch.profiler: **0.70**" in report
    assert "**1.50 M/s**" in report, "30,000 records decoded in 5 ms and collected in 15 ms"
    assert "overhead ratio polyprof/torch.profiler: **0.33**" in report, "medians: (0.11-0.10)/(0.13-0.10)"
    assert "stop to trace written: torch.profiler 300.0 ms; polyprof 100.0 ms" in report
    assert "## Diagnostics (raw)" in report and '- x_cuda_only_torch: {"seconds": 0.1}' in report
    for label in ("CuPy", "Numba", "cuda-python", "JAX", "Triton"):
        assert f"- {label}" in report
    assert "Lightning wrote 1 traces, 1 of them polyprof's" in report
    assert "aten ops identical to torch.profiler's: **True** (1 vs 1)" in report
    assert "kernel names identical (multiset): **True** (4 vs 4 kernels)" in report
    assert "slow_step captured with kernels: **True**" in report and "oom captured: **True**" in report
    assert "failed" not in report


def test_report_names_differences_and_failures(check, tmp_path):
    res = passing_results(check, tmp_path)
    res["a_torch"] = {**res["a_torch"], "kernels": {"gemm": 1, "relu": 1, "extra": 1}}
    res["a_torch"]["attribution"] = {"aten::mm -> gemm": 1, "step -> relu": 1, "- -> outside": 1}
    res["b_jax"] = {"error": "Traceback ...\nModuleNotFoundError: No module named 'jax'"}
    del res["c_torch"]
    report = check.build_report(res)
    assert "**False**" in report and "kernels only in polyprof: outside x1" in report
    assert "kernels only in torch.profiler: extra x1" in report
    assert "**2/3** kernels" in report and "attributed only by torch: aten::mm -> gemm x1" in report
    assert "- JAX: **failed**" in report and "No module named 'jax'" in report
    assert "- torch.profiler: **failed**" in report and "not run" in report


def test_every_part_fails_cleanly_without_a_gpu(check, tmp_path):
    """The script's own driver, on this machine: every GPU part reports its error, the report is built."""
    check.CHECK.script = SCRIPT  # (main() sets it from the script run)
    res = check.CHECK.run(["env", "c_unprofiled"], str(tmp_path))
    assert "error" not in res["env"] and "cuda" in res["env"]["backends"]
    assert "error" in res["c_unprofiled"]
    report = check.build_report(res)
    assert "- unprofiled: **failed**" in report
