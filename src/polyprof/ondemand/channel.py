"""The private control channel: one Unix socket per capturable process, in a folder only its user can
enter, every connection's peer checked, one JSON message per line each way.

::

    folder = socket_folder()            # $XDG_RUNTIME_DIR/polyprof or <tmp>/polyprof-<uid>, 0700
    path = socket_path(os.getpid())     # <folder>/<pid>.sock, 0600
    with connect(pid) as conn:          # the CLI's side
        send(conn, {"op": "status"}); reply = receive(conn)

The folder is created 0700 and refused when it is not a real folder owned by this user with no access
for group or others (another user could otherwise put a socket of theirs there). A connection whose
peer (SO_PEERCRED) is another user is refused, root aside.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import orjson

from polyprof.errors import ConfigError

MAX_MESSAGE_BYTES = 16 * 1024  # a request is a few hundred bytes; anything longer is refused unread
READ_TIMEOUT_S = 2.0  # a peer that does not finish its request in this long (in all) is dropped
BACKLOG = 64  # connections the kernel queues until the listener accepts them (it accepts at once)
MAX_PENDING = 64  # requests being read at once; more connections are refused until some end


class ChannelError(Exception):
    """A message that could not be sent or read (too long, not JSON, cut off, timed out)."""


def socket_folder(create: bool = True) -> str:
    """The per-user folder of the sockets: ``$XDG_RUNTIME_DIR/polyprof`` when that runtime folder is
    this user's, else ``<temp dir>/polyprof-<uid>``; created 0700 (with `create`) and checked private."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = None
    if runtime:
        with contextlib.suppress(OSError):
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
                base = os.path.join(runtime, "polyprof")
    folder = base or os.path.join(tempfile.gettempdir(), f"polyprof-{uid}")
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    _check_private(folder, uid)
    return folder


def _check_private(folder: str, uid: int) -> None:
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return  # nothing there yet (create=False): no sockets
    why = (
        "is not a folder (a link or a file)" if not stat.S_ISDIR(st.st_mode)
        else f"belongs to uid {st.st_uid}, not to this user ({uid})" if st.st_uid != uid
        else f"is open to others (mode {stat.S_IMODE(st.st_mode):o}, must be 700)" if st.st_mode & 0o077
        else ""
    )
    if why:
        raise ConfigError(
            f"polyprof on-demand: the socket folder {folder} {why}; remove it (polyprof creates it 0700) "
            "or set XDG_RUNTIME_DIR to a private folder of yours"
        )


def socket_path(pid: int, folder: str | None = None) -> str:
    return os.path.join(folder or socket_folder(), f"{pid}.sock")


def listening_pids(folder: str | None = None) -> list[int]:
    """The pids that have a socket in the folder (a socket can outlive a killed process)."""
    folder = folder or socket_folder(create=False)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".sock") and n[:-5].isdigit())


def bind(path: str) -> socket.socket:
    """A listening socket at `path`, mode 0600 (a stale socket of a dead process is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # ours by name (<pid>.sock): a leftover of a process that had this pid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)  # inside a 0700 folder: nobody else can reach it before the chmod
        os.chmod(path, 0o600)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_uid(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, from the kernel (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def peer_allowed(uid: int) -> bool:
    """This user, or root."""
    return uid in (os.getuid(), 0)


@contextlib.contextmanager
def connect(pid: int, timeout_s: float = 5.0, folder: str | None = None) -> Iterator[socket.socket]:
    """A connection to process `pid`'s socket (OSError when it is not listening)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(socket_path(pid, folder))
        yield sock
    finally:
        sock.close()


def send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(orjson.dumps(message) + b"\n")


class MessageReader:
    """One message (a line of JSON) assembled from what arrives: ``feed(chunk)`` returns the message once
    its newline is in, else None; ChannelError when it grows past `limit`, the peer closes first (an
    empty chunk), or it is not JSON::

        reader = MessageReader()
        while (message := reader.feed(conn.recv(4096))) is None: ...
    """

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self.data = bytearray()

    def feed(self, chunk: bytes) -> Any:
        if not chunk:
            raise ChannelError("the connection closed before the message ended" if self.data else "no message")
        end = chunk.find(b"\n")
        self.data += chunk if end < 0 else chunk[:end]
        if len(self.data) > self.limit:
            raise ChannelError(f"message longer than {self.limit} bytes")
        if end < 0:
            return None
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError as exc:
            raise ChannelError(f"not JSON ({exc})") from None


def receive(conn: socket.socket, limit: int = MAX_MESSAGE_BYTES, deadline_s: float | None = None) -> Any:
    """One message (a line of JSON) from `conn` (blocking, within its timeout for each read and, with
    `deadline_s`, within that long in all); ChannelError when it is longer than `limit`, not JSON, or the
    peer closes or stalls before its newline."""
    reader = MessageReader(limit)
    ends = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        if ends is not None:
            left = ends - time.monotonic()
            if left <= 0:
                raise ChannelError(f"timed out: the message did not end within {deadline_s:g} s")
            conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            raise ChannelError("timed out before the message ended (one line of JSON, ending in a newline)") from None
        message = reader.feed(chunk)
        if message is not None:
            return message
