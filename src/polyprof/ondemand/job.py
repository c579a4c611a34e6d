"""Whole-job captures through the job's own store (torch.distributed's TCPStore).

The rank the CLI asks publishes the request under one key of the store, with the step every rank is to
start at (a few steps ahead, so that every rank sees it in time); every capturable rank looks at that
key at its step boundaries, at most once a second (one store round trip); each one captures the same
steps, writes its own trace (its rank in the name) and reports under a key of its own; the asked rank
waits for them all and answers the CLI with every rank's path::

    link = JobLink(slot)                # one per process; tracker listener: link.on_step
    accepted = link.publish(request, reply)
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from polyprof.ondemand.capture import Capture, CaptureSlot, Reply
from polyprof.ondemand.protocol import CaptureRequest, error_reply, parse_request
from polyprof.torch.job_store import seal, unseal
from polyprof.torch.steps import tracker

log = logging.getLogger("polyprof.ondemand")

REQUEST_KEY = "polyprof/ondemand/request"
POLL_INTERVAL_S = 1.0
STORE_TIMEOUT_S = 30.0


def _done_key(capture_id: str, rank: int) -> str:
    return f"polyprof/ondemand/{capture_id}/done/{rank}"


def rank_template(template: str) -> str:
    """The ranks' trace path: `template` when it has ``{rank}``, else with ``.rank{rank}`` put before
    the suffix (``cap.json.gz`` -> ``cap.rank{rank}.json.gz``); each rank fills it in."""
    if "{rank}" in template:
        return template
    folder, name = os.path.split(template)
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix):
            return os.path.join(folder, f"{name[: -len(suffix)]}.rank{{rank}}{suffix}")
    return os.path.join(folder, f"{name}.rank{{rank}}")


#: where a rank writes its part of a job capture (else its working directory)
CAPTURE_DIR = "POLYPROF_CAPTURE_DIR"
TRACE_SUFFIXES = (".json.gz", ".pftrace.gz", ".perfetto-trace.gz", ".json", ".pftrace", ".perfetto-trace")


def own_capture_path(requested: str) -> str:
    """Where this rank writes its part of a job capture: its own folder (POLYPROF_CAPTURE_DIR, else its
    working directory) under the requested file name, reduced to ``[A-Za-z0-9_.-]`` and ``{rank}`` (put
    in where the name lacks it). The request comes through the job's store, which anyone who reaches its
    port can write: its folder is never used, so a capture never replaces a file elsewhere."""
    name = re.sub(r"[^A-Za-z0-9_.{}-]", "_", os.path.basename(requested)).lstrip(".")[:200]
    if not name.endswith(TRACE_SUFFIXES):
        name = f"{name or 'capture'}.json.gz"
    return os.path.join(os.environ.get(CAPTURE_DIR) or os.getcwd(), rank_template(name))


def _dist() -> Any:
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


class JobLink:
    def __init__(self, slot: CaptureSlot) -> None:
        self.slot = slot
        self._seen: str | None = None
        self._store: Any = None  # the training thread's client (polling only)
        self._next_poll = 0.0

    # -- the asked rank ------------------------------------------------------------------------------
    def publish(self, request: CaptureRequest, reply: Reply) -> dict[str, Any]:
        """Put the request where every rank sees it; answer `reply` once every rank has reported."""
        from polyprof.torch.job_store import job_store

        dist = _dist()
        if dist is None:
            raise RuntimeError("this process is not a rank of a torch.distributed job (init_process_group has not run): "
                               "capture it without --job")
        per_step = tracker.seconds_per_step or 1.0
        lead = max(3, min(10_000, math.ceil(3 * POLL_INTERVAL_S / per_step)))  # every rank polls in time
        start = tracker.step + lead
        world = dist.get_world_size()
        capture_id = uuid.uuid4().hex
        message = {"id": capture_id, "start_step": start, "steps": request.steps, "duration_s": request.duration_s,
                   "activities": list(request.activities or []), "output": rank_template(request.output),
                   "timeout_s": request.timeout_s, "asked_by": dist.get_rank()}
        store = job_store(STORE_TIMEOUT_S)
        if store is None:
            raise RuntimeError("the job's store cannot be reached: MASTER_ADDR/MASTER_PORT are not set")
        store.set(REQUEST_KEY, seal(message))
        expected = (lead + (request.steps or 0)) * per_step + (request.duration_s or 0.0)
        waiter = threading.Thread(target=self._collect, args=(store, capture_id, world, expected + request.timeout_s, reply),
                                  name="polyprof-capture-job", daemon=True)
        waiter.start()
        return {"job": {"id": capture_id, "world_size": world, "start_step": start, "output": message["output"]}}

    def _collect(self, store: Any, capture_id: str, world: int, timeout_s: float, reply: Reply) -> None:
        deadline = time.monotonic() + timeout_s
        ranks: dict[str, Any] = {}
        for rank in range(world):
            key = _done_key(capture_id, rank)
            try:
                store.wait([key], timedelta(seconds=max(0.1, deadline - time.monotonic())))
                report = unseal(store.get(key))
                ranks[str(rank)] = report if isinstance(report, dict) else error_reply(
                    f"rank {rank}'s report is not one (not sealed with the job's secret, POLYPROF_JOB_SECRET?)")
            except Exception:
                ranks[str(rank)] = error_reply(f"rank {rank} did not report within {timeout_s:.0f} s (is it started "
                                               "with POLYPROF_ON_DEMAND=1, and does it make optimizer steps?)")
        ok = all(r.get("ok") for r in ranks.values())
        reply({"ok": ok, "done": {"ranks": ranks}} if ok else {"ok": False, "error": "not every rank wrote its trace",
                                                                "done": {"ranks": ranks}})

    # -- every rank, at its step boundaries ----------------------------------------------------------
    def on_step(self, step: int) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_INTERVAL_S
        dist = _dist()
        if dist is None:
            return
        try:
            if self._store is None:
                from polyprof.torch.job_store import job_store

                self._store = job_store(STORE_TIMEOUT_S) or False
            if not self._store or not self._store.check([REQUEST_KEY]):
                return
            message = unseal(self._store.get(REQUEST_KEY))
        except Exception as exc:
            log.warning("polyprof on-demand: the job's store could not be read (%s); not polling it again", exc)
            self._store = False
            return
        if not isinstance(message, dict) or message.get("id") == self._seen:
            return
        self._seen = message.get("id")
        self._join(message, dist.get_rank())

    def _join(self, message: dict[str, Any], rank: int) -> None:
        from polyprof.formats.common.paths import check_output_path

        capture_id = str(message.get("id"))

        def report(result: dict[str, Any]) -> None:
            from polyprof.torch.job_store import job_store

            store = job_store(STORE_TIMEOUT_S)  # a client of its own: this runs on the export thread
            store.set(_done_key(capture_id, rank), seal(result))

        try:
            fields = {k: message.get(k) for k in ("output", "steps", "duration_s", "activities", "timeout_s")}
            request = parse_request({"op": "capture", "job": True, **{k: v for k, v in fields.items() if v not in (None, [])}})
            if not isinstance(request, CaptureRequest) or request.last_s is not None:
                raise RuntimeError("not a capture of steps or seconds")
            output = check_output_path(own_capture_path(request.output))
            capture = self.slot.take(
                lambda done: Capture(request, output, done, start_step=int(message["start_step"]),
                                     metadata={"job": {"id": capture_id, "asked_by": message.get("asked_by")}}),
                report,
            )
            capture.begin()
        except Exception as exc:
            log.warning("polyprof on-demand: rank %d cannot join capture %s: %s", rank, capture_id, exc)
            try:
                report(error_reply(f"rank {rank}: {exc}"))
            except Exception:
                pass
