"""Install profiles as pip makes them: polyprof's wheel (built once, with and without the C extension)
in a fresh virtual environment with some of its extras, dependencies from the package index.

    venv = profiles.venv("store")        # made once per test session, under a temporary folder
    subprocess.run([venv / "bin" / "polyprof", "backends"])

Used by tests/test_install_profiles.py (every command in every profile) and tests/test_docs_blocks.py
(the docs' blocks in the profile their page names).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

try:
    import torch

    TORCH: str | None = f"torch=={torch.__version__.split('+')[0]}"  # the suite's own version, from the index
except ImportError:
    TORCH = None

#: profile -> (the extras installed, whether the wheel has the C extension)
PROFILES: dict[str, tuple[tuple[str, ...], bool]] = {
    "base": ((), True),
    "report": (("report",), True),
    "store": (("store",), True),
    "torch": (("torch",), True),
    "everything": (("report", "store", "counters", "torch"), True),
    "pure Python": ((), False),
}


def pip(python: Path, *args: str, timeout: int = 900) -> None:
    """pip install into `python`'s environment; skips the test where the index cannot be reached."""
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 and ("Could not find a version" in r.stderr or "NewConnectionError" in r.stderr):
        pytest.skip(f"needs the package index for polyprof's dependencies: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]


class Profiles:
    """The session's wheels and profile environments, each made on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.wheels: dict[bool, Path] = {}
        self.venvs: dict[str, Path] = {}

    def wheel(self, with_c: bool) -> Path:
        """polyprof's wheel from a copy of the source (the tree's build/ is not reused); without the C
        extension as a machine without a C compiler builds it."""
        if with_c not in self.wheels:
            src = self.folder / f"source-{with_c}"
            for name in ("src", "setup.py", "pyproject.toml", "README.md"):
                if (ROOT / name).is_dir():
                    shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
                else:
                    shutil.copy(ROOT / name, src / name)
            dist = self.folder / f"dist-{with_c}"
            env = {**os.environ, **({} if with_c else {"CC": "false"})}
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
                               capture_output=True, text=True, timeout=900, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            (self.wheels[with_c],) = dist.glob("polyprof-*.whl")
        return self.wheels[with_c]

    def venv(self, profile: str) -> Path:
        """The environment of `profile` (a key of PROFILES), made once."""
        if profile not in self.venvs:
            extras, with_c = PROFILES[profile]
            if "torch" in extras and TORCH is None:
                pytest.skip("needs torch in the test environment (its version is the one installed)")
            venv = self.folder / profile.replace(" ", "-")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            wheel = self.wheel(with_c)
            pip_extras = [e for e in extras if e != "torch"]
            pip(venv / "bin" / "python", f"{wheel}[{','.join(pip_extras)}]" if pip_extras else str(wheel),
                *([TORCH] if "torch" in extras and TORCH else []))
            self.venvs[profile] = venv
        return self.venvs[profile]


def skip_reason() -> str | None:
    return "POLYPROF_SKIP_VENV_TESTS=1" if os.environ.get("POLYPROF_SKIP_VENV_TESTS") == "1" else None
