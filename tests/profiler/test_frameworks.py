"""Frameworks that make torch.profiler themselves, unchanged, with ``POLYPROF_TORCH_PROFILER=1``: the
traces they write where they write them are polyprof's, hold the aten operators torch.profiler's
trace of the same run holds, and (Lightning, with ``POLYPROF_ACTIVITIES=+opencl``) the OpenCL work
their steps made. Each script in tests/frameworks/ runs twice in a fresh interpreter: with the switch
(polyprof) and without (torch.profiler)."""

import gzip
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parents[1] / "frameworks"
pytest.importorskip("torch", reason="needs torch (CPU build): the frameworks run on it")


def needs(*modules: str):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (scripts/setup.sh --test installs it)")


def opencl_device() -> str:
    try:
        import pyopencl as cl

        return "" if any(p.get_devices() for p in cl.get_platforms()) else "needs an OpenCL device (PoCL)"
    except Exception as exc:
        return f"needs pyopencl and an OpenCL device (PoCL): {exc}"


def run(script: str, out: Path, polyprof: bool, *args: str, env: dict | None = None) -> list[dict]:
    """Run `script` with OUT as its first argument; the JSON documents of every trace it wrote."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    if polyprof:
        environment.update({"POLYPROF_TORCH_PROFILER": "1", **(env or {})})
    r = subprocess.run([sys.executable, str(HERE / script), str(out), *args], env=environment, cwd=out.parent,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    paths = sorted(p for p in out.rglob("*") if p.name.endswith((".json", ".json.gz")))
    assert paths, f"{script} wrote no trace under {out}: {r.stderr[-2000:]}"
    return [json.loads(gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()) for p in paths]


def aten_ops(documents: list[dict]) -> set[str]:
    return {e["name"] for d in documents for e in d["traceEvents"]
            if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")}


def compare(script: str, tmp_path: Path, *args: str, env: dict | None = None) -> list[dict]:
    ours = run(script, tmp_path / "polyprof", True, *args, env=env)
    theirs = run(script, tmp_path / "torch", False, *args)
    assert all("polyprof" in d for d in ours), "every trace the framework wrote is polyprof's"
    assert not any("polyprof" in d for d in theirs)
    assert aten_ops(ours) == aten_ops(theirs) != set()
    return ours


@needs("lightning", "pyopencl")
def test_lightning_pytorch_profiler_with_a_schedule_and_opencl_work(tmp_path):
    reason = opencl_device()
    if reason:
        pytest.skip(reason)
    ours = compare("lightning_fit.py", tmp_path, env={"POLYPROF_ACTIVITIES": "+opencl"})
    events = [e for d in ours for e in d["traceEvents"]]
    assert any(e.get("cat") == "kernel" and e["name"] == "twice" for e in events)
    assert any(e.get("cat") == "gpu_memcpy" for e in events) and any(e.get("cat") == "gpu_memset" for e in events)
    assert any(e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#") for e in events)
    assert all(d["polyprof"]["activities"] == ["CPU", "OPENCL"] for d in ours)


@needs("accelerate")
def test_accelerate_profile_kwargs(tmp_path):
    ours = compare("accelerate_profile.py", tmp_path)
    assert any("Input Dims" in e.get("args", {}) for d in ours for e in d["traceEvents"]), "record_shapes went through"


@needs("transformers")
def test_transformers_trainer_with_the_profiler_callback_recipe(tmp_path):
    ours = compare("transformers_trainer.py", tmp_path)
    assert len(ours) == 1, "one cycle of the schedule: one trace from tensorboard_trace_handler"


@needs("torchtitan")
def test_torchtitan_profiling_helper(tmp_path):
    with socket.socket() as s:  # a free port for the one-rank gloo group
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ours = compare("torchtitan_profiler.py", tmp_path, port)
    assert len(ours) == 2, "torchtitan writes iteration_3 and iteration_6"
