"""The capturable process's side: one daemon thread, blocked in ``select()`` between requests.

::

    import polyprof
    polyprof.listen()        # or POLYPROF_ON_DEMAND=1 in the environment, or polyprof run --on-demand

Each connection: its peer's uid checked as it is accepted (SO_PEERCRED; another user is refused, root
aside, and the refusal logged), one request read (a line of JSON, at most 16 KB, all of it within 2 s
of the connection), checked (:mod:`.protocol`), answered. Requests are read side by side (a selector,
up to ``channel.MAX_PENDING`` at once, more refused as busy), so a slow or silent peer holds only its
own connection: a status request is answered while another connection dawdles. A capture's connection
stays open until its trace is written; the CLI going away meanwhile changes nothing for the capture.
Nothing a peer sends can raise into the process: every failure becomes an error reply, or a dropped
connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import sys
import threading
import time
from typing import Any

from polyprof.ondemand import channel
from polyprof.ondemand.capture import Capture, CaptureSlot
from polyprof.ondemand.job import JobLink
from polyprof.ondemand.protocol import CaptureRequest, RequestError, StatusRequest, error_reply, parse_request
from polyprof.torch.steps import tracker

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
        self._wake: tuple[socket.socket, socket.socket] | None = None  # stop() writes, the thread wakes
        #: what answers ``last_s`` requests (a running flight recorder sets itself here: its
        #: ``capture_to(path, last_s, evidence)`` and ``seconds``, ``failures``); None: none runs
        self.last_seconds: Any = None

    @property
    def listening(self) -> bool:
        return self._sock is not None and self.owner == os.getpid()

    def start(self) -> str:
        if self.listening:
            return self.path or ""
        path = channel.socket_path(os.getpid())
        self._sock = channel.bind(path)
        self._sock.setblocking(False)  # the selector says when a connection waits
        self._wake = socket.socketpair()
        self.path, self.owner = path, os.getpid()
        tracker.install()
        tracker.add_listener(self.job.on_step)
        self._thread = threading.Thread(target=self._serve, name="polyprof-on-demand", daemon=True)
        self._thread.start()
        return path

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"x")
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
        wake, self._wake = self._wake, None
        for end in wake or ():
            with contextlib.suppress(OSError):
                end.close()
        self.slot.forget()

    def _serve(self) -> None:
        sock, wake = self._sock, self._wake
        if sock is None or wake is None:
            return
        selector = selectors.DefaultSelector()
        try:
            selector.register(sock, selectors.EVENT_READ, "accept")
            selector.register(wake[0], selectors.EVENT_READ, "wake")
        except (ValueError, OSError):  # stopped (closed) before this thread began: a program that ended at once
            selector.close()
            return
        pending: dict[socket.socket, tuple[channel.MessageReader, float]] = {}  # requests being read
        try:
            while self._sock is sock:
                deadline = min((d for _, d in pending.values()), default=None)
                try:
                    events = selector.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except OSError:
                    events = []  # (the listening socket closed under it: the loop's test ends it)
                for key, _ in events:
                    if key.data == "accept":
                        self._accept(sock, selector, pending)
                    elif key.data == "read":
                        self._read(key.fileobj, selector, pending)  # type: ignore[arg-type]
                self._expire(selector, pending)
        finally:
            for conn in pending:
                with contextlib.suppress(OSError):
                    conn.close()
            selector.close()

    def _accept(self, sock: socket.socket, selector: selectors.BaseSelector, pending: dict) -> None:
        try:
            conn, _ = sock.accept()
        except OSError:  # (gone before it was accepted, or the listener stopped)
            return
        try:
            conn.settimeout(channel.READ_TIMEOUT_S)  # for the replies: a peer that does not read is dropped
            peer_pid, uid = channel.peer_uid(conn)
            if not channel.peer_allowed(uid):
                self.refused += 1
                log.warning("polyprof on-demand: refused a request from uid %d (pid %d): only uid %d or root may "
                            "capture this process", uid, peer_pid, os.getuid())
                self._reply_and_close(conn, error_reply("refused: this process belongs to another user"))
                return
            if len(pending) >= channel.MAX_PENDING:
                self._reply_and_close(conn, error_reply(f"busy: {channel.MAX_PENDING} requests are being read; "
                                                        "try again"))
                return
            conn.setblocking(False)
            selector.register(conn, selectors.EVENT_READ, "read")
            pending[conn] = (channel.MessageReader(), time.monotonic() + channel.READ_TIMEOUT_S)
        except Exception:  # a peer must never end the listener
            log.exception("polyprof on-demand: a connection failed")
            with contextlib.suppress(OSError):
                conn.close()

    def _read(self, conn: socket.socket, selector: selectors.BaseSelector, pending: dict) -> None:
        reader, _ = pending[conn]
        try:
            request = reader.feed(conn.recv(4096))
        except BlockingIOError:
            return
        except (OSError, channel.ChannelError) as exc:
            self._done_reading(conn, selector, pending)
            self._reply_and_close(conn, error_reply(f"bad request: {exc}"))
            return
        if request is None:
            return
        self._done_reading(conn, selector, pending)
        try:
            conn.settimeout(channel.READ_TIMEOUT_S)
            self._answer(conn, request)
        except Exception:  # a peer must never end the listener
            log.exception("polyprof on-demand: a request failed")
            with contextlib.suppress(OSError):
                conn.close()

    def _expire(self, selector: selectors.BaseSelector, pending: dict) -> None:
        now = time.monotonic()
        for conn in [c for c, (_, deadline) in pending.items() if deadline <= now]:
            self._done_reading(conn, selector, pending)
            self._reply_and_close(conn, error_reply(f"bad request: it did not end within {channel.READ_TIMEOUT_S:g} s "
                                                    "(one line of JSON, ending in a newline)"))

    @staticmethod
    def _done_reading(conn: socket.socket, selector: selectors.BaseSelector, pending: dict) -> None:
        pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            selector.unregister(conn)

    @staticmethod
    def _reply_and_close(conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.settimeout(channel.READ_TIMEOUT_S)
            channel.send(conn, message)
        with contextlib.suppress(OSError):
            conn.close()

    def _answer(self, conn: socket.socket, message: Any) -> None:
        """Answer one request read in full; a capture's connection stays open until its trace is written."""
        keep = False
        try:
            try:
                request = parse_request(message)
            except RequestError as exc:
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

        if request.last_s is not None:
            return self._flight_capture(conn, request, reply)
        capture = None
        with lock:
            try:
                if request.job:
                    accepted = self.job.publish(request, reply)
                else:
                    from polyprof.formats.common.paths import check_output_path

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

    def _flight_capture(self, conn: socket.socket, request: CaptureRequest, reply: Any) -> bool:
        """``last_s``: the flight recorder running here writes its last seconds to the output, on a
        thread of its own; an error when none runs."""
        from polyprof.formats.common.paths import check_output_path

        recorder = self.last_seconds
        try:
            if recorder is None:
                raise RuntimeError("no flight recorder runs in this process (POLYPROF_FLIGHT_RECORDER=SECONDS, "
                                   "polyprof run --flight-recorder, polyprof.flight_recorder() start one)")
            output = check_output_path(request.output)
            conn.settimeout(10.0)
            channel.send(conn, {"ok": True, "accepted": {**request.describe(), "output": output}})
        except Exception as exc:
            with contextlib.suppress(OSError):
                channel.send(conn, error_reply(str(exc)))
            return False

        def write() -> None:
            started = time.time()
            written = recorder.capture_to(output, request.last_s, {"asked_by": "polyprof capture --last"})
            if written is None:
                reply(error_reply(f"the flight recorder could not write {output}: {'; '.join(recorder.failures[-1:])}"))
                return
            reply({"ok": True, "done": {"path": written, "seconds": round(time.time() - started, 3), "notes": []}})

        threading.Thread(target=write, name="polyprof-flight-on-demand", daemon=True).start()
        return True

    def status(self) -> dict[str, Any]:
        from polyprof._version import __version__
        from polyprof.formats.common.paths import rank_fields

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
            **(rank_fields() if distributed else {}),
            "job": _job_key() if distributed else None,
            "steps": tracker.step,
            "step_sources": sorted(tracker.sources),
            "seconds_per_step": tracker.seconds_per_step,
            "capture": self.slot.status(),
            "refused": self.refused,
            "flight_recorder_s": getattr(self.last_seconds, "seconds", None),
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
