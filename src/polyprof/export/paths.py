"""Checking and atomically replacing output files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO

from polyprof.errors import OutputPathError


def check_output_path(path: str | os.PathLike) -> str:
    """Fail now, not after a long run, when `path` cannot be written. Returns the absolute path."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise OutputPathError(
            f"cannot write the trace to {path}: it is a directory; give a file name such as trace.json"
        )
    if not os.path.isdir(folder):
        raise OutputPathError(
            f"cannot write the trace to {path}: folder {folder} does not exist; create it first"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write the trace to {path}: folder {folder} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write the trace to {path}: the existing file is not writable")
    return path


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """Write to a temporary file beside `path`, then rename it into place; on failure remove it,
    so no half-written file ever appears under the final name."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
