"""Every rank of a torch.distributed job captures the same window: a trigger on one rank is published
through the job's store (torchrun's TCPStore, MASTER_ADDR:MASTER_PORT) with its time, and every rank's
recorder, whose daemon thread watches the store (so a rank stuck in a collective still answers),
captures the seconds before it::

    link = JobLink(rank, on_trigger)      # on_trigger(message): a trigger another rank published
    link.start()                          # the watching thread (nothing where there is no job)
    link.publish({"trigger": ..., "evidence": ..., "at_epoch_s": ...})   # from the writer thread

A trigger is numbered by the store's counter (``polyprof/flight/count``) and kept under
``polyprof/flight/trigger/N``; each rank (the trigger's too) answers under
``polyprof/flight/trigger/N/rank/R`` with its capture's path, so every rank can say in its capture which
ranks answered and which did not (killed, or stuck where no Python thread runs).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from polyprof.formats.common.paths import launcher_rank
from polyprof.torch.import_hook import import_completed
from polyprof.torch.job_store import seal, unseal

log = logging.getLogger("polyprof.flight")

#: the metadata key of a capture's trigger and evidence (and, here, its ranks' answers)
FLIGHT_KEY = "polyprof.flight"
COUNT_KEY = "polyprof/flight/count"
POLL_S = 0.5
STORE_TIMEOUT_S = 10.0


#: a trigger numbered but not published after this long is skipped (publishing is add, then set)
MISSING_WAIT_S = 5.0
#: at most this many triggers behind the store's count are looked at (the rest are skipped, counted)
MAX_BEHIND = 16
#: a trigger's message larger than this is not one (a name, evidence numbers, a rank, a time)
MAX_MESSAGE_BYTES = 16 * 1024
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")


def safe_name(text: Any) -> str:
    """A trigger's name as it goes into a capture's file name: letters, digits, ``_.-``, at most 40, not
    starting with a dot; anything else becomes ``_`` (a name from the store is data, never a path)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(text))[:40].lstrip(".")
    return name if _NAME.fullmatch(name) else "job"


def job_message(raw: Any, number: int) -> dict[str, Any] | None:
    """A trigger read from the job's store, checked: None unless it is a JSON object of at most
    MAX_MESSAGE_BYTES with an integer rank (sealed with the job's secret where POLYPROF_JOB_SECRET is
    set); its trigger name made safe, its time a finite number, its evidence an object (anything else
    dropped)."""
    if not isinstance(raw, (bytes, str)) or len(raw) > MAX_MESSAGE_BYTES:
        return None
    message = unseal(raw)
    if not isinstance(message, dict) or not isinstance(message.get("rank"), int):
        return None
    at = message.get("at_epoch_s")
    evidence = message.get("evidence")
    return {
        "trigger": safe_name(message.get("trigger", "job")),
        "rank": message["rank"],
        "at_epoch_s": float(at) if isinstance(at, (int, float)) and math.isfinite(at) else time.time(),
        "evidence": evidence if isinstance(evidence, dict) else {},
        "number": number,
    }


def trigger_key(number: int) -> str:
    return f"polyprof/flight/trigger/{number}"


def answer_key(number: int, rank: int) -> str:
    return f"{trigger_key(number)}/rank/{rank}"


def job_rank() -> tuple[int, int] | None:
    """(rank, world size) of this process in a job launched with a store's address (torchrun, env://);
    None for a lone process."""
    launched = launcher_rank()
    if launched is None:
        return None
    rank, world = launched
    if world < 2 or not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        return None
    return rank, world


def _client() -> Any:
    from polyprof.torch.job_store import job_store

    return job_store(STORE_TIMEOUT_S)


class JobLink:
    def __init__(self, rank: int, world: int, on_trigger: Callable[[dict[str, Any]], Any]) -> None:
        self.rank, self.world, self.on_trigger = rank, world, on_trigger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publisher: Any = None  # the writer thread's own client (a client per thread)
        self._reports: list[threading.Thread] = []  # the threads putting answers into captures
        self.skipped = 0  # triggers in the store that were malformed, never published or too many

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="polyprof-flight-job", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        store, seen = None, None
        missing_since: dict[int, float] = {}
        while not self._stop.wait(POLL_S):
            if store is None and not import_completed("torch"):
                continue  # the store's client is torch's: never imported here while the program imports torch
            try:
                if store is None:
                    store = _client()  # the store may come up after this process (init_process_group)
                    if store is None:
                        return
                count = int(store.add(COUNT_KEY, 0))
                if seen is None:
                    seen = count  # triggers from before this process started are not this run's
                    continue
                if count - seen > MAX_BEHIND:  # a count pushed far ahead (by anyone who reaches the store)
                    self.skipped += count - seen - MAX_BEHIND
                    seen = count - MAX_BEHIND
                for number in range(seen + 1, count + 1):
                    if not store.check([trigger_key(number)]):  # numbered but not (yet) published
                        if time.monotonic() - missing_since.setdefault(number, time.monotonic()) < MISSING_WAIT_S:
                            break
                        self.skipped += 1  # never published: skipped, never waited on
                    else:
                        message = job_message(store.get(trigger_key(number)), number)
                        if message is None:
                            self.skipped += 1
                        elif message["rank"] != self.rank:
                            self.on_trigger(message, store)
                    missing_since.pop(number, None)
                    seen = number
            except Exception as exc:  # noqa: BLE001 - the store is down or not up yet: try again later
                log.debug("polyprof flight recorder: the job's store: %s", exc)
                store = None
                if self._stop.wait(2.0):
                    return

    def publish(self, message: dict[str, Any]) -> int | None:
        """Publish a trigger of this rank to the others; its number (None when the store cannot be
        reached)."""
        try:
            if self._publisher is None:
                self._publisher = _client()
                if self._publisher is None:
                    return None
            number = int(self._publisher.add(COUNT_KEY, 1))
            self._publisher.set(trigger_key(number), seal({**message, "rank": self.rank}))
            return number
        except Exception as exc:  # noqa: BLE001 - a capture on this rank is still written
            log.debug("polyprof flight recorder: cannot publish to the job's store: %s", exc)
            self._publisher = None
            return None

    def answer(self, number: int, path: str | None, store: Any = None) -> None:
        """This rank's answer to trigger `number`: the path of its capture (None: none was written)."""
        try:
            (store or self._publisher).set(answer_key(number, self.rank), seal({"path": path}))
        except Exception as exc:  # noqa: BLE001 - the others then name this rank as not answering
            log.debug("polyprof flight recorder: cannot answer through the job's store: %s", exc)

    def put_answers(self, number: int, written: str, wait_s: float, failures: list[str]) -> None:
        """The ranks that answered trigger `number` within `wait_s`, and those that did not, put into
        this rank's capture `written` (:func:`add_job_answers`); a failure is noted in `failures`."""
        answers = self.answers(number, wait_s)
        try:
            add_job_answers(written, {str(r): p for r, p in answers["answered"].items()}, answers["missing"])
        except Exception as exc:  # noqa: BLE001 - the capture stays as it was written
            failures.append(f"answers to trigger {number}: {exc}")

    def put_answers_later(self, number: int, written: str, wait_s: float, failures: list[str]) -> None:
        """:meth:`put_answers` on a thread of its own (:meth:`join_reports` waits for them)."""
        thread = threading.Thread(target=self.put_answers, args=(number, written, wait_s, failures),
                                  name="polyprof-flight-answers", daemon=True)
        self._reports = [t for t in self._reports if t.is_alive()] + [thread]
        thread.start()

    def join_reports(self, timeout: float) -> None:
        for thread in self._reports:
            thread.join(timeout=timeout)

    def answers(self, number: int, wait_s: float) -> dict[str, Any]:
        """The other ranks that answered trigger `number` within `wait_s` (rank -> path) and those that
        did not (a rank killed, or stuck where no Python thread runs); a client of its own, so any
        thread may ask."""
        answered: dict[int, Any] = {}
        deadline = time.monotonic() + wait_s
        try:
            store = _client()
        except Exception:  # noqa: BLE001 - the store is gone: no rank can be said to have answered
            store = None
        for rank in range(self.world):
            if rank == self.rank or store is None:
                continue
            left = deadline - time.monotonic()
            try:
                store.wait([answer_key(number, rank)], timedelta(seconds=max(0.05, left)))
                answer = unseal(store.get(answer_key(number, rank)))
                answered[rank] = str(answer.get("path")) if isinstance(answer, dict) else None
            except Exception:  # noqa: BLE001 - not in time
                continue
        missing = [r for r in range(self.world) if r != self.rank and r not in answered]
        return {"answered": answered, "missing": missing}


def add_job_answers(path: str, answered: dict[str, Any], missing: list[int]) -> None:
    """The capture at `path` rewritten (beside it, then renamed over it) with the ranks that answered
    its trigger and those that did not in its ``polyprof.flight`` ``job`` metadata."""
    from polyprof.formats import load_trace
    from polyprof.formats.files import write_trace

    trace = load_trace(path)
    trace.metadata[FLIGHT_KEY].setdefault("job", {}).update(answered=answered, missing=missing)
    partial = os.path.join(os.path.dirname(path), f".answers-{os.getpid()}-{os.path.basename(path)}")
    try:
        write_trace(trace, partial)
        os.replace(partial, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(partial)


class TriggerBudget:
    """How many of the other ranks' triggers may be captured: `burst` at once, then one per gap,
    whatever the triggers' names (a flood of names is not a capture each).

    ::

        budget = TriggerBudget(3)
        budget.take(time.monotonic(), gap_s=30.0)   # True: capture it; False: too soon
    """

    def __init__(self, burst: int) -> None:
        self.burst = burst
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self, now: float, gap_s: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) / max(gap_s, 1e-3))
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
