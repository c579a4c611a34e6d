"""Checking and atomically replacing output files."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
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


def _new_file_mode() -> int:
    """The mode a new file gets here (0666 less the umask), read without changing it for good."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """Write to a temporary file beside `path`, then rename it into place; on failure remove it, so no
    half-written file ever appears under the final name. The temporary file is created exclusively
    (a name planted there, a symlink included, is never followed or overwritten) and readable by its
    owner only until it has the final file's mode: the existing file's, or a new file's. An OS error
    while writing (disk full, a read-only folder) is an OutputPathError naming the path."""
    folder, name = os.path.split(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = _new_file_mode()
    except OSError as exc:
        raise OutputPathError(f"cannot write the trace to {path}: {exc.strerror or exc}") from exc
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"cannot write the trace to {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputPathError):
            raise OutputPathError(f"writing the trace to {path} failed: {exc.strerror or exc}") from exc
        raise
