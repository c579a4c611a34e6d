"""Each rank's clock against rank 0's, measured over the job's own torch.distributed store.

Every process maps its host clock to Unix epoch (``time.time_ns``); across hosts those epochs differ by
NTP's error. At a profile's start and stop, rank r sends rank 0 a few pings through the default store
(the TCPStore torchrun and ``init_process_group`` set up) and rank 0 answers each with its epoch time;
the answer of the shortest round trip gives the offset (rank 0's epoch minus this rank's at the same
instant) and its uncertainty (half that round trip). Rank 0 also hands every rank the job's
``baseTimeNanoseconds`` (:data:`polyprof.plugin.clock.JOB_BASE_KEY`), so that ranks whose profiles start
either side of midnight UTC write one base::

    sync = ClockSync.start_measuring("start")    # background threads on every rank; never blocks
    ...
    sync.result()  # {"reference": "rank 0", "offset_ns": ..., "uncertainty_ns": ..., "round_trips": 16}

Both sides run on daemon threads with a short time limit, so a rank that does not profile, or a store
that is slow, costs a missing measurement (said in the result), never a stalled step. Ranks agree on
the keys by counting their measurements, so ranks that start and stop their profiles together (a
schedule, ``polyprof run``) pair up.
"""

from __future__ import annotations

import atexit
import threading
import time
from datetime import timedelta
from typing import Any

from polyprof.plugin.clock import JOB_BASE_KEY, job_base_time_ns

ROUND_TRIPS = 16
TIME_LIMIT_S = 10.0  # a limit for a job in trouble: the pings take milliseconds
POLL_S = 0.25  # waits are this short, so that the threads end soon when the process does
_counter = 0
_counter_lock = threading.Lock()
_ending = threading.Event()
_threads: list[threading.Thread] = []


EXIT_GRACE_S = 3.0


@atexit.register
def _end_measurements() -> None:
    """At exit: let measurements still going (rank 0 answering slower ranks) finish for a moment, then
    end them, so that no thread is left inside a store call (a daemon thread there can abort the
    interpreter's shutdown)."""
    deadline = time.monotonic() + EXIT_GRACE_S
    for thread in list(_threads):
        thread.join(max(0.0, deadline - time.monotonic()))
    _ending.set()
    for thread in list(_threads):
        thread.join(2 * POLL_S)


def _wait(store: Any, key: str, deadline: float) -> None:
    """Wait for `key` until `deadline` (monotonic), in short waits; TimeoutError when it does not come."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or _ending.is_set():
            raise TimeoutError(key)
        try:
            store.wait([key], timedelta(seconds=min(POLL_S, left)))
            return
        except Exception:  # the store's timeout: look again until the deadline
            if time.monotonic() >= deadline:
                raise


def _store_and_rank() -> tuple[Any, int, int] | None:
    """A store client of this measurement's own (:func:`.job_store.job_store`), this rank and the
    world size."""
    import sys

    from polyprof.torch.job_store import job_store

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        store = job_store(TIME_LIMIT_S)  # None: a job rendezvoused some other way, no store to reach
        return None if store is None else (store, dist.get_rank(), dist.get_world_size())
    except Exception:  # a job in an odd state, or its store is gone
        return None


class ClockSync:
    """One measurement (at a profile's start or stop) of this rank's clock against rank 0's."""

    def __init__(self, when: str) -> None:
        self.when = when
        self._result: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def start_measuring(cls, when: str) -> ClockSync | None:
        """Start measuring in the background; None when there is no multi-rank job to measure in."""
        global _counter
        with _counter_lock:  # counted on every rank alike, whether or not this one can measure
            _counter += 1
            number = _counter
        job = _store_and_rank()
        if job is None:
            return None
        store, rank, world = job
        sync = cls(when)
        prefix = f"polyprof/clock/{number}"
        target = sync._serve if rank == 0 else sync._ask
        sync._thread = threading.Thread(
            target=target, args=(store, prefix, rank, world), name=f"polyprof-clock-{when}", daemon=True
        )
        _threads[:] = [t for t in _threads if t.is_alive()] + [sync._thread]
        sync._thread.start()
        return sync

    def _serve(self, store: Any, prefix: str, rank: int, world: int) -> None:
        """Rank 0: answer every rank's pings with this rank's epoch time, whichever rank comes first (a
        rank that reaches its stop late must not hold up the others)."""
        base = job_base_time_ns(time.time_ns())
        self._result = {"reference": "rank 0", "when": self.when, "offset_ns": 0, "uncertainty_ns": 0, JOB_BASE_KEY: base}
        deadline = time.monotonic() + TIME_LIMIT_S
        next_ping = dict.fromkeys(range(1, world), 0)  # rank -> its next ping to answer
        try:
            store.set(f"{prefix}/base", str(base))  # before any answer: a rank answered finds it
            while next_ping and time.monotonic() < deadline and not _ending.is_set():
                answered = False
                for other, i in list(next_ping.items()):
                    key = f"{prefix}/ping/{other}/{i}"
                    if store.check([key]):
                        store.set(f"{prefix}/pong/{other}/{i}", str(time.time_ns()))
                        answered = True
                        next_ping[other] = i + 1
                        if i + 1 == ROUND_TRIPS:
                            del next_ping[other]
                if not answered:
                    _ending.wait(0.0005)  # (ends at once when the process does)
        except BaseException:  # the store went away: the ranks that asked in time were answered
            pass

    def _ask(self, store: Any, prefix: str, rank: int, world: int) -> None:
        """Rank r: ping rank 0, keep the answer with the shortest round trip."""
        deadline = time.monotonic() + TIME_LIMIT_S
        best: tuple[int, int] | None = None  # (round trip, offset)
        base: int | None = None
        try:
            for i in range(ROUND_TRIPS):
                sent = time.time_ns()
                store.set(f"{prefix}/ping/{rank}/{i}", str(sent))
                _wait(store, f"{prefix}/pong/{rank}/{i}", deadline)
                answer = int(store.get(f"{prefix}/pong/{rank}/{i}"))
                back = time.time_ns()
                trip = back - sent
                if best is None or trip < best[0]:
                    best = (trip, answer - (sent + back) // 2)
                if base is None:
                    base = int(store.get(f"{prefix}/base"))
        except BaseException as exc:
            if best is None:
                self._result = {"reference": "rank 0", "when": self.when, "measured": False,
                                "why": f"rank 0 did not answer within {TIME_LIMIT_S:g} s ({type(exc).__name__})"}
                return
        assert best is not None
        self._result = {"reference": "rank 0", "when": self.when, "offset_ns": best[1],
                        "uncertainty_ns": max(1, best[0] // 2), "round_trips": ROUND_TRIPS}
        if base is not None:
            self._result[JOB_BASE_KEY] = base

    def finish(self, wait_s: float = TIME_LIMIT_S) -> None:
        """Wait (up to `wait_s`) until this rank's part is done: rank 0 has answered every rank."""
        if self._thread is not None:
            self._thread.join(wait_s)

    def result(self, wait_s: float = TIME_LIMIT_S) -> dict[str, Any]:
        """The measurement (waiting up to `wait_s` for it; rank 0, the reference, has it at once while
        it goes on answering the others)."""
        if self._thread is not None and self._result is None:
            self._thread.join(wait_s)
        if self._result is None:
            return {"reference": "rank 0", "when": self.when, "measured": False, "why": "still measuring"}
        return self._result


def summarize(start: ClockSync | None, end: ClockSync | None, wait_s: float = TIME_LIMIT_S) -> dict[str, Any] | None:
    """What the trace records: the offset to rank 0 at start and at stop, and the drift between them."""
    if start is None and end is None:
        return None
    out: dict[str, Any] = {"reference": "rank 0", "method": "pings through the torch.distributed store"}
    for name, sync in (("start", start), ("stop", end)):
        if sync is not None:
            out[name] = {k: v for k, v in sync.result(wait_s).items() if k not in ("reference", "when")}
    a, b = out.get("start", {}), out.get("stop", {})
    if "offset_ns" in a and "offset_ns" in b:
        out["drift_ns"] = b["offset_ns"] - a["offset_ns"]
    if "offset_ns" in a:
        out["offset_ns"], out["uncertainty_ns"] = a["offset_ns"], a["uncertainty_ns"]
    base = a.get(JOB_BASE_KEY, b.get(JOB_BASE_KEY))
    if base is not None:  # the base the job's ranks share (the merge takes it)
        out[JOB_BASE_KEY] = base
    return out
