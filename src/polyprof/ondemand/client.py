"""The CLI's side of on-demand capture: find the capturable processes, ask one for a capture, wait.

::

    for proc in capturable():            # {"pid", "command", "rank", "world_size", "capture", ...}
        ...
    final = ask_capture(pid, {"op": "capture", "steps": 3, "output": "/abs/cap.json.gz"},
                        on_accepted=print)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from polyprof.ondemand import channel


class CaptureFailed(Exception):
    """The target refused the capture, or it ended without a trace; the message says why."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def capturable(timeout_s: float = 2.0) -> list[dict[str, Any]]:
    """Every capturable process of this user with its status; sockets left by dead processes are removed."""
    folder = channel.socket_folder(create=False)
    found = []
    for pid in channel.listening_pids(folder):
        try:
            with channel.connect(pid, timeout_s, folder) as conn:
                channel.send(conn, {"op": "status"})
                reply = channel.receive(conn, limit=1 << 20)
        except (OSError, channel.ChannelError) as exc:
            if not _alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(channel.socket_path(pid, folder))
            else:
                found.append({"pid": pid, "error": f"not answering ({exc})"})
            continue
        if isinstance(reply, dict) and reply.get("ok"):
            found.append(reply)
    return found


def ask_capture(pid: int, request: dict[str, Any], on_accepted: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Send `request` to process `pid`, hand its acceptance to `on_accepted`, and return the final
    reply's ``done`` part once the trace is written; CaptureFailed with the target's reason otherwise."""
    try:
        with channel.connect(pid, 10.0) as conn:
            channel.send(conn, request)
            first = channel.receive(conn, limit=1 << 20)
            if not isinstance(first, dict) or not first.get("ok"):
                raise CaptureFailed(str(first.get("error") if isinstance(first, dict) else first))
            on_accepted(first.get("accepted") or {})
            conn.settimeout(None)  # as long as the capture takes
            final = channel.receive(conn, limit=1 << 24)
    except FileNotFoundError:
        raise CaptureFailed(
            f"process {pid} is not capturable: start it with POLYPROF_ON_DEMAND=1 (or polyprof run --on-demand, "
            "or call polyprof.listen()); polyprof ps lists the capturable ones"
        ) from None
    except channel.ChannelError as exc:
        raise CaptureFailed(
            f"process {pid} ended the connection before its trace was written ({exc}); if it exited, "
            "polyprof recover can read the spill it left beside the output"
        ) from None
    except OSError as exc:
        raise CaptureFailed(f"process {pid} cannot be reached: {exc}") from None
    if not isinstance(final, dict):
        raise CaptureFailed(f"process {pid} answered {final!r}")
    if not final.get("ok"):
        raise CaptureFailed(str(final.get("error")) + _rank_errors(final.get("done")))
    return final.get("done") or {}


def _rank_errors(done: Any) -> str:
    ranks = (done or {}).get("ranks") if isinstance(done, dict) else None
    if not isinstance(ranks, dict):
        return ""
    bad = [f"rank {r}: {v.get('error')}" for r, v in ranks.items() if isinstance(v, dict) and not v.get("ok")]
    return ("; " + "; ".join(bad)) if bad else ""
