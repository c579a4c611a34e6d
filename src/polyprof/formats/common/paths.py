"""Output paths: which format a path names, checking them, and replacing output files atomically."""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

from polyprof.errors import ConfigError, OutputPathError

PLACEHOLDERS = ("rank", "local_rank", "world_size", "host", "pid")


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        raise OutputPathError(
            f"unknown placeholder {{{key}}} in the trace path; use {', '.join('{' + p + '}' for p in PLACEHOLDERS)} "
            "({{ and }} for literal braces)"
        )


def launcher_rank() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) as the launcher (torchrun) set them; None where it set none."""
    try:
        return int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", 1))
    except (KeyError, ValueError):
        return None


def rank_fields() -> dict[str, int]:
    """rank, local_rank and world_size: torch.distributed's when it is initialised, else the launcher's
    (torchrun's RANK, LOCAL_RANK, WORLD_SIZE), else a single process's (0, 0, 1)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
            return {"rank": dist.get_rank(), "local_rank": local, "world_size": dist.get_world_size()}
    except Exception:  # a job in an odd state: fall back to the environment
        pass

    def env(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return {"rank": env("RANK", 0), "local_rank": env("LOCAL_RANK", 0), "world_size": env("WORLD_SIZE", 1)}


def expand_placeholders(path: str | os.PathLike) -> str:
    """`path` with ``{rank}``, ``{local_rank}``, ``{world_size}``, ``{host}`` and ``{pid}`` filled in
    (``traces/rank{rank}.json.gz``); a path without braces is returned as it is."""
    text = os.fspath(path)
    if "{" not in text and "}" not in text:
        return text
    import socket

    fields = _Fields(rank_fields(), host=socket.gethostname(), pid=os.getpid())
    try:
        return text.format_map(fields)
    except OutputPathError:
        raise
    except (ValueError, IndexError, AttributeError) as exc:
        raise OutputPathError(f"cannot fill in the trace path {text!r}: {exc} ({{{{ and }}}} for literal braces)") from None


#: a path ending so names a trace store (polyprof.store), a folder each rank adds its tables to
STORE_SUFFIX = ".polyprof"
#: the file that makes a folder a store and lists its ranks (known without the store extra's libraries)
MANIFEST = "store.json"
#: a path ending so (before a ".gz") names a Perfetto trace; any other, Chrome JSON
PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace")
FORMATS = ("json", "perfetto", "store")


def format_of(path: str | os.PathLike, format: str | None = None) -> str:
    """"perfetto", "store" or "json": `format` when given (checked), else what the path's suffix says."""
    if format is not None:
        if format not in FORMATS:
            raise ConfigError(f"unknown trace format {format!r}: use one of {', '.join(FORMATS)}")
        return format
    name = os.fspath(path).lower().rstrip("/")
    if name.endswith(STORE_SUFFIX):
        return "store"
    if name.endswith(".gz"):
        name = name[:-3]
    return "perfetto" if name.endswith(PERFETTO_SUFFIXES) else "json"


def check_output_path(path: str | os.PathLike) -> str:
    """Fail now, not after a long run, when `path` cannot be written. Placeholders (``{rank}``...) are
    filled in. Returns the absolute path."""
    path = os.path.abspath(expand_placeholders(path))
    folder = os.path.dirname(path)
    is_store = path.lower().rstrip("/").endswith(STORE_SUFFIX)  # a store: a folder each rank adds to
    if os.path.isdir(path) and is_store:
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputPathError(f"cannot write into the store {path}: it is not writable")
        return path
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
    _check_replaceable(path, folder)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write the trace to {path}: the existing file is not writable")
    return path


def _check_replaceable(path: str, folder: str) -> None:
    """The trace is renamed over `path` at the end (:func:`atomic_output`): in a sticky folder (such as
    /tmp) only the owner of what is there, the folder's owner or root may do that."""
    try:
        there, where = os.lstat(path), os.stat(folder)
    except FileNotFoundError:
        return
    uid = os.getuid()
    if where.st_mode & stat.S_ISVTX and uid not in (0, there.st_uid, where.st_uid):
        what = "a link" if stat.S_ISLNK(there.st_mode) else "a file"
        raise OutputPathError(
            f"cannot write the trace to {path}: it is {what} of another user's (uid {there.st_uid}) in a folder "
            "where only its owner may replace it (sticky, as /tmp is); choose another name"
        )


GZIP_LEVEL = 3  # ~2x faster than the default 9 for a few percent more bytes


@contextlib.contextmanager
def trace_output(path: str) -> Iterator[IO[bytes]]:
    """:func:`atomic_output`, through gzip when `path` ends in ``.gz``: where every trace writer writes."""
    with atomic_output(path) as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as gz:
                yield gz
        else:
            yield raw


def read_owned_file(path: str, max_bytes: int, *, not_writable_by_others: bool = False) -> tuple[bytes | None, str | None]:
    """A file another user or process may have put at `path`, read as data: (its bytes, None); (None,
    None) where there is none; (None, why) where it is not read: a link, a FIFO or anything but a
    regular file (opened without following links or waiting), not this user's or root's, more than
    `max_bytes`, or (with `not_writable_by_others`) writable by group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, str(exc.strerror or exc)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, "it is not a regular file"
        if st.st_uid not in (os.getuid(), 0):
            return None, f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()}) or root"
        if not_writable_by_others and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, f"others may write it (mode {stat.S_IMODE(st.st_mode):04o}): chmod go-w {path}"
        if st.st_size > max_bytes:
            return None, f"it is {st.st_size:,} bytes, more than the {max_bytes:,} expected at most"
        return f.read(max_bytes), None


def new_private_file(path: str) -> int:
    """A new file at a name polyprof chose (a spill, a crash or stack file): its descriptor, open for
    writing, the file readable by this user only. What was there is replaced: unlinked first (a symlink goes, its target is left
    alone), then created exclusively without following links, so that a name planted in a shared folder
    is never written through. OSError where that cannot be done (another user's file in a sticky
    folder, which then stays as it was)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def new_file_mode() -> int:
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
        mode = new_file_mode()
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
