"""The capturable process's side: one daemon thread, blocked in ``accept()`` between requests.

::

    import polyprof
    polyprof.listen()        # or POLYPROF_ON_DEMAND=1 in the environment, or polyprof run --on-demand

Each connection: its peer's uid checked (SO_PEERCRED; another user is refused, root aside, and the
refusal logged), one request read (a line of JSON, at most 16 KB, within 2 s), checked
(:mod:`.protocol`), answered. A capture's connection stays open until its trace is written; the CLI
going away meanwhile changes nothing for the capture. Nothing a peer sends can raise into the
process: every failure becomes an error reply, or a dropped connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from typing import Any

from polyprof.backends.torch.steps import tracker
from polyprof.ondemand import channel
from polyprof.ondemand.capture import Capture, CaptureSlot
from polyprof.ondemand.job import JobLink
from polyprof.ondemand.protocol import CaptureRequest, RequestError, StatusRequest, error_reply, parse_request

log = logging.getLogger("polyprof.ondemand")


class Listener:
    def __init__(self) -> None:
        self.path: str | None = None
        self.owner = 0  # the pid that bound the socket (a forked child is not it)
        self.refused = 0
        self.slot = CaptureSlot()
        self.job = JobLink(self.slot)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        return self._sock is not None and self.owner == os.getpid()

    def start(self) -> str:
        if self.listening:
            return self.path or ""
        path = channel.socket_path(os.getpid())
        self._sock = channel.bind(path)
        self.path, self.owner = path, os.getpid()
        tracker.install()
        tracker.add_listener(self.job.on_step)
        self._thread = threading.Thread(target=self._serve, name="polyprof-on-demand", daemon=True)
        self._thread.start()
        return path

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self.path and self.owner == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def forked(self) -> None:
        """In a forked child: the socket and the capture are the parent's; this process does not listen."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self.slot.forget()

    def _serve(self) -> None:
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._sock is None:
                    return  # stopped
                continue
            try:
                self._handle(conn)
            except Exception:  # a peer must never end the listener
                log.exception("polyprof on-demand: a request failed")
                with contextlib.suppress(OSError):
                    conn.close()

    def _handle(self, conn: socket.socket) -> None:
        keep = False
        try:
            peer_pid, uid = channel.peer_uid(conn)
            if not channel.peer_allowed(uid):
                self.refused += 1
                log.warning("polyprof on-demand: refused a request from uid %d (pid %d): only uid %d or root may "
                            "capture this process", uid, peer_pid, os.getuid())  # fmt: skip
                with contextlib.suppress(OSError):
                    channel.send(conn, error_reply("refused: this process belongs to another user"))
                return
            conn.settimeout(channel.READ_TIMEOUT_S)
            try:
                request = parse_request(channel.receive(conn))
            except (channel.ChannelError, RequestError) as exc:
                channel.send(conn, error_reply(f"bad request: {exc}"))
                return
            if isinstance(request, StatusRequest):
                channel.send(conn, {"ok": True, **self.status()})
                return
            keep = self._capture(conn, request)
        except OSError:
            pass  # the peer went away
        finally:
            if not keep:
                with contextlib.suppress(OSError):
                    conn.close()

    def _capture(self, conn: socket.socket, request: CaptureRequest) -> bool:
        """Start the capture; True when `conn` waits for its end (and is closed then)."""
        lock = threading.Lock()  # "accepted" goes out before anything the capture says

        def reply(message: dict[str, Any]) -> None:
            with lock, contextlib.suppress(OSError):  # the CLI may be gone: the capture is done anyway
                channel.send(conn, message)
                conn.close()

        capture = None
        with lock:
            try:
                if request.job:
                    accepted = self.job.publish(request, reply)
                else:
                    from polyprof.export.paths import check_output_path

                    output = check_output_path(request.output)
                    capture = self.slot.take(lambda done: Capture(request, output, done), reply)
                    accepted = {"output": output}
                    if request.steps is not None and not tracker.sources:
                        accepted["note"] = "no step seen yet: waiting for the first one"
            except Exception as exc:  # a path that cannot be written, an unknown activity, a capture running...
                channel.send(conn, error_reply(str(exc)))
                return False
            try:
                conn.settimeout(10.0)
                channel.send(conn, {"ok": True, "accepted": {**request.describe(), **accepted}})
                gone = False
            except OSError:
                gone = True
        if gone:  # (out of the lock: finishing replies, and the reply takes it)
            if capture is not None:
                capture.finish("the CLI that asked went away before the capture started")
            return False
        if capture is not None:
            try:
                capture.begin()
            except Exception as exc:
                log.exception("polyprof on-demand: the capture could not start")
                capture.finish(f"the capture could not start: {type(exc).__name__}: {exc}")
        return True

    def status(self) -> dict[str, Any]:
        from polyprof._version import __version__
        from polyprof.export.paths import _rank_fields

        dist = sys.modules.get("torch.distributed")
        distributed = False
        with contextlib.suppress(Exception):
            distributed = bool(dist is not None and dist.is_available() and dist.is_initialized())
        return {
            "pid": os.getpid(),
            "command": " ".join(sys.argv) or sys.executable,
            "polyprof": __version__,
            "host": socket.gethostname(),
            "distributed": distributed,
            **(_rank_fields() if distributed else {}),
            "job": _job_key() if distributed else None,
            "steps": tracker.step,
            "step_sources": sorted(tracker.sources),
            "seconds_per_step": tracker.seconds_per_step,
            "capture": self.slot.status(),
            "refused": self.refused,
        }


def _job_key() -> str:
    """Which job a rank belongs to: its store's address and torchrun's run id."""
    env = os.environ
    return f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}/{env.get('TORCHELASTIC_RUN_ID', '')}"


_listener = Listener()
os.register_at_fork(after_in_child=_listener.forked)


def listen() -> str:
    """Make this process capturable (``polyprof ps`` lists it, ``polyprof capture PID`` captures it);
    returns its socket's path. Nothing is recorded until a capture is asked for. Safe to call twice."""
    import atexit

    path = _listener.start()
    atexit.register(_listener.stop)
    return path


def listener() -> Listener:
    return _listener
