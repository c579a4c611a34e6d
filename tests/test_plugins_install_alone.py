"""Adding a device needs no change to polyprof: a fresh virtual environment with only polyprof and the
ROCm and IPU plugins installed (as a user would, with pip) lists both backends in `polyprof backends`,
unavailable here with the reason a user can act on (this machine has neither ROCm nor a Poplar SDK)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.environ.get("POLYPROF_SKIP_VENV_TESTS") == "1", reason="POLYPROF_SKIP_VENV_TESTS=1")
def test_a_fresh_venv_with_polyprof_and_the_plugins_lists_them(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT),
                        str(ROOT / "plugins" / "polyprof-rocm"), str(ROOT / "plugins" / "polyprof-ipu")],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and ("Could not find a version" in r.stderr or "NewConnectionError" in r.stderr):
        pytest.skip(f"needs PyPI for polyprof's dependencies: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(venv / "bin" / "polyprof"), "backends"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    lines = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("│")}
    assert "unavailable" in lines["amdsmi"] and "AMD SMI" in lines["amdsmi"]
    assert "unavailable" in lines["rocm"] and "rocprofiler-sdk not found" in lines["rocm"]
    assert "unavailable" in lines["ipu"] and "PopVision" in lines["ipu"]
    assert "unavailable" in lines["pvti"] and "libpvti" in lines["pvti"]
    assert not {"cuda", "xpu", "opencl"} & set(lines), "only what was installed"
