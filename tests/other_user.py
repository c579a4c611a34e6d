"""Acting as another user of the machine (for the tests of what another user can plant or hold): the
test process must be root, and acts as ``nobody`` through setpriv, as a second login would be.

    from other_user import NOBODY, as_other_user, needs_other_user, sticky_folder

    @needs_other_user
    def test_x(tmp_path):
        shared = sticky_folder(tmp_path / "shared")      # 1777, like /tmp
        as_other_user("mkdir", str(shared / "planted"))  # owned by nobody
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NOBODY = 65534
needs_other_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another user (CI runs as root)",
)


def as_other_user(*command: str, input: str | None = None) -> subprocess.CompletedProcess:
    """Run `command` as uid/gid 65534 (nobody); raises if it fails."""
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *command],
                          input=input, capture_output=True, text=True, check=True, timeout=120)


def skip_unless_other_user_runs(python: str) -> None:
    """Skip (naming why) where another user cannot run `python` with polyprof: a checkout inside a
    folder only its owner may enter (``mktemp -d`` makes one 0700)."""
    try:
        as_other_user(python, "-c", "import polyprof")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"another user cannot run this checkout's interpreter ({exc.stderr.strip().splitlines()[-1:]})")


def sticky_folder(path: Path) -> Path:
    """A folder everyone can write, sticky (each user may only rename or remove their own), as /tmp is;
    its parents open enough for another user to reach it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o1777)
    for parent in path.parents:
        if str(parent) in ("/", "/tmp"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o711)
    return path
