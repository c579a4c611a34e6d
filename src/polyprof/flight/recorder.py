"""The flight recorder: a profile that is always on, keeps only its last seconds, and writes them when
something goes wrong (a slow step, a hang, a fatal exception, a signal) or when asked.

::

    recorder = polyprof.flight_recorder(seconds=30, out_dir="flight")   # started; stop() or `with`
    ...                                                                  # training, unchanged
    recorder.capture("manual", {"why": "looked odd"})                    # any time: a path, later

It is a :class:`~polyprof.engine.scheduled.Profile` in ring mode (its rows older than `seconds` let go as
they age, so memory does not grow with the run) whose steps come from the optimizer's step hook
(no code change) or :meth:`FlightRecorder.step`, each one a ``ProfilerStep#N`` span. Operators: the
top-level ones by default (``ops="top"``: what a step spends its time in, at a small share of the
cost), every one (``"all"``) or none (``"none"``). Captures are written on a thread of their own, so
the training thread never waits for one; each trace names its trigger and evidence in its metadata
(``polyprof.flight``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from polyprof.errors import ConfigError
from polyprof.flight.captures import capture_path, keep_under_caps, launched_rank, who
from polyprof.flight.job import FLIGHT_KEY, JobLink, TriggerBudget, job_rank
from polyprof.flight.triggers import (
    CrashRows,
    CrashStacks,
    CudaOutOfMemory,
    ExitHooks,
    HangWatchdog,
    SignalTriggers,
    SlowSteps,
)
from polyprof.merge.memory import release_freed_memory

OPS = ("top", "all", "none")
#: triggers after which the process ends (its capture waits up to ENDING_ANSWER_S for the others' answers)
ENDING_TRIGGERS = ("exception", "collective_timeout", "exit")
#: other ranks' triggers captured at once before the job-wide rate (one per min_gap_s) applies
JOB_BURST = 3
ENDING_ANSWER_S = 3.0
#: how often the writer thread gives the memory the ring freed back to the system
TRIM_EVERY_S = 10.0


class FlightRecorder:
    """See the module docstring. `seconds`: how much each capture holds (the ring; `max_mb`: under about
    this many megabytes, the oldest let go first); `slow_step`: a step longer than this many times the
    median of the last steps is a capture (None: off);
    `slow_step_s`: or longer than this many seconds; `hang_s`: no step boundary for this long is a
    capture, with every thread's Python stack beside it (None: off); `after_s`: a capture waits this long
    after its trigger, so that it holds what followed too; `signals`: the signals that capture (SIGTERM
    and SIGINT then end the process as they would have); `on_exception`: an uncaught exception
    captures before the program ends; `min_gap_s`: a trigger fires at most once in this long;
    `format`: "pftrace" or "json" (gzip); `job`: in a torch.distributed job (torchrun), a trigger on one
    rank makes every rank capture the same window (:mod:`polyprof.flight.job`); `crash_spill`: what the
    ring holds is also on disk (``flight-WHO.spill``, two generations, handed over every second), so
    that a process that crashes or is killed leaves it for ``polyprof recover``, and every thread's
    Python stack at a fatal signal (``flight-crash-WHO-stacks.txt``); `capturable`: ``polyprof ps``
    lists the process and ``polyprof capture PID --last S`` writes its last seconds; `max_captures`,
    `max_captures_mb`: this process's captures kept in `out_dir` at most (the oldest removed first; None:
    no cap). One failure is one capture: an ending trigger (an exception, an exit, SIGTERM, SIGINT, or
    another rank's) within `min_gap_s` of another is answered by the capture already made."""

    def __init__(
        self,
        seconds: float = 30.0,
        *,
        out_dir: str | os.PathLike = "flight",
        activities: Iterable[Any] | None = ("cpu",),
        ops: str = "top",
        slow_step: float | None = 3.0,
        slow_step_s: float | None = None,
        hang_s: float | None = 300.0,
        after_s: float = 0.0,
        signals: Iterable[str] = ("SIGUSR2", "SIGTERM", "SIGINT"),
        on_exception: bool = True,
        min_gap_s: float | None = None,
        format: str = "pftrace",
        job: bool = True,
        crash_spill: bool = True,
        capturable: bool = True, max_mb: float | None = 256.0, max_captures: int | None = 20,
        max_captures_mb: float | None = 1024.0, **profile_options: Any,
    ) -> None:
        _check_options(ops, format, seconds, after_s, max_captures, max_captures_mb)
        self.seconds = float(seconds)
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.ops = ops
        self.after_s = float(after_s)
        self.min_gap_s = self.seconds if min_gap_s is None else float(min_gap_s)
        self.suffix = ".pftrace" if format == "pftrace" else ".json.gz"
        self.captures: list[str] = []  # the traces written, in order
        self.write_seconds: list[float] = []  # how long each took to write, from the dump's start
        self.failures: list[str] = []  # captures that could not be written, and why
        self._activities = list(activities) if activities is not None else None
        # rows change hands four times per ring (the ring lets go of them a part at a time; a capture
        # takes what is newer itself), and every second where a crash must find them on disk
        self.spill_path = os.path.join(self.out_dir, f"flight-{who()}.spill") if crash_spill else None
        flush = 1.0 if crash_spill else max(1.0, self.seconds / 4)
        self._profile_options = {"flush_interval_s": flush, "ring_mb": max_mb, **profile_options}
        self._crash_stacks: Any = None
        self._crash_rows: Any = None
        self._slow = SlowSteps(slow_step, slow_step_s, self._trigger)
        self._hang = HangWatchdog(hang_s, self._trigger) if hang_s else None
        self._signals = SignalTriggers(tuple(signals), self._trigger_now, before_ending=self._before_ending,
                                       busy=lambda: self._main_writing, capture_later=self._signalled)
        self._main_writing = False  # the main thread is writing a capture (a signal then waits for it)
        self._exit = ExitHooks(self._trigger_now) if on_exception else None
        self._oom = CudaOutOfMemory(self._trigger)
        self._last_fired: dict[str, float] = {}
        self._jobs: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._dumping = threading.Lock()  # one capture written at a time (the writer's, the job's)
        self.profile: Any = None
        self._active = False  # started and not stopped (its profile is None while it steps aside)
        self.stepped_aside = 0  # how many times the script's own profiler made it step aside
        self._tracker: Any = None
        self._job: Any = None  # the link to the other ranks, in a torch.distributed job
        self._job_wanted = job
        self._capturable = capturable
        self.answer_wait_s = 10.0  # how long a rank waits for the others' answers to a job's trigger
        self.max_captures = max_captures
        self.max_captures_bytes = None if max_captures_mb is None else max_captures_mb * 1e6
        self._last_ending = -1e18  # (monotonic) when the last ending trigger was claimed
        self._job_budget = TriggerBudget(JOB_BURST)  # other ranks' triggers captured
        self._write_s = self._write_s_seen = 0.0  # time spent writing captures, and as the last step saw it
        self._write_started: float | None = None  # (monotonic) when the capture being written began

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> FlightRecorder:
        if self._active:
            return self
        if self.spill_path is not None:
            os.makedirs(self.out_dir, exist_ok=True)
        self.profile = self._recording()
        self._active = True
        self._writer = threading.Thread(target=self._write_loop, name="polyprof-flight-writer", daemon=True)
        self._writer.start()
        self._install_step_source()
        if self._hang is not None:
            self._hang.start(os.path.join(self.out_dir, f"flight-hang-{who()}-stacks.txt"))
        self._signals.install()
        if self._exit is not None:
            self._exit.install()
        if self.spill_path is not None:
            from polyprof.formats.spill.crash import CRASH_SUFFIX

            hang_stacks = self._hang.stacks_path if self._hang is not None else None
            self._crash_rows = CrashRows(self.spill_path + CRASH_SUFFIX, hang_stacks)  # (before faulthandler: see CrashRows)
            self._crash_stacks = CrashStacks(os.path.join(self.out_dir, f"flight-crash-{who()}-stacks.txt"))
        self._link_job()
        _running.append(self)
        if self._capturable:
            from polyprof.ondemand.listener import listen, listener

            try:
                listen()
                listener().last_seconds = self
            except Exception as exc:  # noqa: BLE001 - recording goes on; only `capture --last` is lost
                self.failures.append(f"cannot be made capturable: {exc}")
        return self

    def _link_job(self) -> None:
        where = job_rank() if self._job_wanted else None
        if where is not None:
            self._job = JobLink(*where, on_trigger=self._on_job_trigger)
            self._job.start()

    def _recording(self) -> Any:
        """The recorder's profile, started; it steps aside when the script's own profiler starts."""
        from polyprof.engine.scheduled import Profile

        profile = Profile(self._activities, ring_s=self.seconds, record_steps=True, spill=self.spill_path,
                          extra={"torch_ops": self.ops, "fwdbwd_carry_s": self.seconds + self.after_s + 10}, **self._profile_options)
        profile.yield_to = self._step_aside
        profile.start()
        return profile

    def _step_aside(self, other: Any) -> None:
        """The script's own profiler (torch.profiler, polyprof's or torch's) starts recording operators,
        and one profiler records them at a time: the recorder lets its ring go and records again when
        that profiler stops (what happened meanwhile is in that profiler's trace). The slow-step and hang
        watches go on; a capture meanwhile has nothing to write."""
        from polyprof.engine import exclusive

        profile = self.profile
        if profile is None:
            return
        with self._dumping:  # (not in the middle of a capture)
            self.profile = None
            profile.stop(wait=True, discard=True)  # (its hand-over done before the other's recorders start)
            profile.close_spill(remove=True)
        self.stepped_aside += 1
        exclusive.when_free(self._come_back)

    def _come_back(self) -> None:
        if not self._active or self.profile is not None:
            return
        try:
            self.profile = self._recording()
        except Exception as exc:  # noqa: BLE001 - never into the program
            self.failures.append(f"cannot record again after the script's profiler stopped: {exc}")

    def stop(self, wait: bool = True) -> None:
        """Stop recording (nothing more is captured); `wait`: for the captures in progress to be written
        and the recording's end to be done (else it ends in the background)."""
        if not self._active:
            return
        self._active = False
        if self in _running:
            _running.remove(self)
        if self._capturable:
            from polyprof.ondemand.listener import listener

            if listener().last_seconds is self:
                listener().last_seconds = running()
        if self._tracker is not None:
            self._tracker.remove_listener(self._on_tracked_step)
        if self._hang is not None:
            self._hang.stop()
        self._signals.uninstall()
        if self._exit is not None:
            self._exit.uninstall()
        if self._job is not None:
            self._job.stop()
        self._oom.quiet()
        if wait:
            self._jobs.join()
        self._jobs.put(None)
        profile, self.profile = self.profile, None
        if profile is not None:  # (None while the script's own profiler records)
            profile.stop(wait=wait, discard=True)  # (captures are the output: the ring is let go, unmerged)
            profile.close_spill(remove=True)  # a clean end: nothing to recover
        if self._crash_stacks is not None:
            self._crash_stacks.close()
            self._crash_stacks = None
        if self._crash_rows is not None:
            self._crash_rows.close()
            self._crash_rows = None
        if wait and self._writer is not None:
            self._writer.join(timeout=60)
        if wait and self._job is not None:
            self._job.join_reports(self.answer_wait_s + 30)

    def __enter__(self) -> FlightRecorder:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- steps ------------------------------------------------------------------------------------
    def _install_step_source(self) -> None:
        from polyprof.torch.steps import tracker

        tracker.install()
        tracker.add_listener(self._on_tracked_step)
        self._tracker = tracker

    def _on_tracked_step(self, _count: int) -> None:
        self.step()

    def step(self) -> None:
        """A step boundary (the optimizer's step hook calls this; a loop with no optimizer calls it
        itself): the step span ends and the next begins, and the slow-step and hang triggers see it."""
        profile = self.profile
        now = time.monotonic()
        if profile is None:  # stepped aside for the script's own profiler: the hang watch still sees steps
            if self._active and self._hang is not None:
                self._hang.beat(now)
            return
        ended = profile.step_num
        profile.step()
        if self._hang is not None:
            self._hang.beat(now)
        started = self._write_started
        writing_s = self._write_s + (now - started if started is not None else 0.0)
        excused, self._write_s_seen = writing_s - self._write_s_seen, writing_s
        self._slow.step_ended(ended, now, excused)
        if not self._oom.attached and ended < 1000:  # (CUDA comes into use in the first steps, or never)
            self._oom.attach_if_cuda_is_in_use()

    # -- captures ---------------------------------------------------------------------------------
    def capture(self, trigger: str = "manual", evidence: Mapping[str, Any] | None = None) -> None:
        """Write the last `seconds` (and `after_s` more) to a trace named after `trigger`, on the
        writer thread; :attr:`captures` lists the paths written."""
        self._trigger(trigger, dict(evidence or {}), gap=False)

    def _claim(self, trigger: str, now: float, gap: bool = True, evidence: Mapping[str, Any] | None = None) -> bool:
        """Whether `trigger` may fire now (not within `min_gap_s` of its last time, unless `gap` is
        off; an ending trigger not within `min_gap_s` of another, whatever `gap`); it is then marked."""
        ending = _ending(trigger, evidence or {})
        with self._lock:
            if gap and now - self._last_fired.get(trigger, -1e18) < self.min_gap_s:
                return False
            if ending and now - self._last_ending < self.min_gap_s:
                return False
            self._last_fired[trigger] = now
            if ending:
                self._last_ending = now
        return True

    def _latest_capture(self, wait_s: float = 30.0) -> str | None:
        """The last capture written, once the one being written (if any) is done."""
        if self._dumping.acquire(timeout=wait_s):
            self._dumping.release()
        return self.captures[-1] if self.captures else None

    def _trigger(self, trigger: str, evidence: dict[str, Any], gap: bool = True) -> bool:
        now = time.monotonic()
        if not self._claim(trigger, now, gap):
            return False
        self._jobs.put((trigger, evidence, time.time(), now + self.after_s))
        return True

    def _trigger_now(self, trigger: str, evidence: dict[str, Any]) -> str | None:
        """A capture written on the calling thread before it returns (a signal; or the process is about
        to end, and in a job waits a little for the other ranks to answer: its end may make the launcher
        stop them)."""
        if self.profile is None:
            return None
        ending = _ending(trigger, evidence)
        if not self._claim(trigger, time.monotonic(), gap=False, evidence=evidence):
            return self._latest_capture()  # (this failure's capture is made: waited for, not made twice)
        main = threading.current_thread() is threading.main_thread()
        self._main_writing = main
        try:
            return self._publish_and_write(trigger, evidence, time.time(), answers_here_s=ENDING_ANSWER_S if ending else None)
        finally:
            if main:
                self._main_writing = False
                pending, self._signals.pending = self._signals.pending, None
                if pending is not None:  # SIGTERM came while this was written: it ends the process now
                    self._signals.end_as_signalled(pending)

    def _signalled(self, trigger: str, evidence: dict[str, Any]) -> None:
        """A signal after which the program goes on (SIGUSR2): captured on the writer thread, every time."""
        self._trigger(trigger, evidence, gap=False)

    def _before_ending(self) -> None:
        """The process is about to end by a signal (no atexit then): the files that only a crash or a
        kill needs are removed, as at a clean stop."""
        with contextlib.suppress(Exception):
            self.stop(wait=False)

    def _publish_and_write(self, trigger: str, evidence: dict[str, Any], wall: float, not_before: float = 0.0,
                           answers_here_s: float | None = None) -> str | None:
        """This rank's trigger: published to the other ranks (they start on it at once), written here
        (not before `not_before`, monotonic), and the ranks' answers put into it (on a thread of its
        own, or here, waiting at most `answers_here_s`)."""
        number = None
        if self._job is not None:
            number = self._job.publish({"trigger": trigger, "evidence": evidence, "at_epoch_s": wall})
        delay = not_before - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        written = self._write(trigger, evidence, wall, job={"trigger_number": number} if number else None)
        if number is not None:
            self._job.answer(number, written)
            if written is not None and answers_here_s is not None:
                self._job.put_answers(number, written, answers_here_s, self.failures)
            elif written is not None:
                self._job.put_answers_later(number, written, self.answer_wait_s, self.failures)
        return written

    def _on_job_trigger(self, message: dict[str, Any], store: Any = None) -> None:
        """Another rank's trigger (on the job thread): the same window captured here and answered, unless
        this rank captured the same trigger within `min_gap_s` (its capture is the answer then)."""
        trigger, number = message["trigger"], message["number"]  # (checked: flight/job.py job_message)
        evidence = message["evidence"]
        now = time.monotonic()
        if not self._claim(trigger, now, evidence=evidence) or not self._job_budget.take(now, self.min_gap_s):  # (a repeat costs nothing)
            self._job.answer(number, self._latest_capture(), store)
            return
        behind = min(max(0.0, time.time() - message["at_epoch_s"]), self.seconds)
        job = {"origin_rank": message["rank"], "trigger_number": number}
        written = self._write(trigger, evidence, time.time(), job=job, last_s=self._span_s(evidence) + behind)
        self._job.answer(number, written, store)
        if written is not None:
            self._job.put_answers_later(number, written, self.answer_wait_s, self.failures)

    def capture_to(self, path: str, last_s: float, evidence: Mapping[str, Any] | None = None) -> str | None:
        """The last `last_s` seconds (as far as the ring holds them) written to `path` now, on the
        calling thread (``polyprof capture PID --last``); the path written, None when it could not be."""
        return self._write("on_demand", dict(evidence or {}), time.time(), last_s=last_s, path=path)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the captures asked for so far to be written (True when they are)."""
        done = threading.Event()
        threading.Thread(target=lambda: (self._jobs.join(), done.set()), daemon=True).start()
        return done.wait(timeout)

    def _write_loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=TRIM_EVERY_S)
            except queue.Empty:
                # the ring's hand-overs free blocks amid those kept: glibc held them (RSS +25 MB a minute
                # with a 30 s ring, gone at a trim); a few ms here, off the training thread
                release_freed_memory()
                continue
            try:
                if job is None:
                    return
                self._publish_and_write(*job)
            finally:
                self._jobs.task_done()

    def _span_s(self, evidence: dict[str, Any]) -> float:  # `seconds` before the trigger, or slow step or hang
        return self.seconds + self.after_s + float(evidence.get("step_s") or evidence.get("silent_s") or 0.0)

    def _write(self, trigger: str, evidence: dict[str, Any], wall: float, *, job: dict[str, Any] | None = None,
               last_s: float | None = None, path: str | None = None) -> str | None:
        profile = self.profile
        if profile is None:
            return None
        path = path or capture_path(self.out_dir, trigger, wall, self.suffix)
        meta = {FLIGHT_KEY: {"trigger": trigger, "evidence": evidence, "at_epoch_s": wall, "seconds": self.seconds,
                             "after_s": self.after_s, "host": socket.gethostname(), "pid": os.getpid(), "rank": launched_rank(),
                             **({"job": job} if job else {})}}
        started = time.perf_counter()
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with self._dumping:
                self._write_started = time.monotonic()
                try:
                    written = profile.dump(path, last_s=last_s or self._span_s(evidence), metadata=meta)
                finally:  # (a step is judged without the time captures were written in it: see step)
                    self._write_s += time.monotonic() - self._write_started
                    self._write_started = None
        except Exception as exc:  # noqa: BLE001 - a capture never raises into the program
            self.failures.append(f"{trigger}: {exc}")
            return None
        if trigger == "hang" and self._hang is not None:
            self._hang.write_stacks(written)
        self.write_seconds.append(time.perf_counter() - started)
        self.captures.append(written)
        self.captures[:] = keep_under_caps(self.captures, self.out_dir, self.max_captures, self.max_captures_bytes)
        release_freed_memory()  # (the capture's merge freed its columns amid the ring's: a long run grew)
        return written

_running: list[FlightRecorder] = []  # the recorders started in this process, the latest last


def _forked_child() -> None:
    """In a forked child (a DataLoader worker) the parent's recorder is not this process's: its threads
    did not come along, and what it would record would pile up, never handed over or let go. Recording
    stops here (flags only: a lock a parent's thread held at the fork would never be let go)."""
    if not _running:
        return
    from polyprof import _native, annotations
    from polyprof.torch import observer

    annotations.recorder.end()
    observer.quiet_loaded_in_child()
    _native.crash_rows_disarm()  # (a worker's crash would write into the parent's crash file)
    for recorder in _running:
        recorder.profile = None  # nothing more is captured, stopped or written from this process
    _running.clear()


os.register_at_fork(after_in_child=_forked_child)


def running() -> FlightRecorder | None:
    """The flight recorder running in this process (the latest started), or None."""
    return _running[-1] if _running else None


def _ending(trigger: str, evidence: Mapping[str, Any]) -> bool:
    """Whether `trigger` ends the process (a failure, or a signal that stops it)."""
    return trigger in ENDING_TRIGGERS or trigger == "signal" and evidence.get("signal") in ("SIGTERM", "SIGINT")


def _check_options(ops: str, format: str, seconds: Any, after_s: Any, max_captures: Any = None,
                   max_captures_mb: Any = None) -> None:
    if max_captures is not None and (not isinstance(max_captures, int) or max_captures < 1):
        raise ConfigError(f"flight_recorder(max_captures={max_captures!r}): a whole number, at least 1 (None: no cap)")
    if max_captures_mb is not None and (not isinstance(max_captures_mb, (int, float)) or not max_captures_mb > 0):
        raise ConfigError(f"flight_recorder(max_captures_mb={max_captures_mb!r}): megabytes, above 0 (None: no cap)")
    if ops not in OPS:
        raise ConfigError(f"flight_recorder(ops={ops!r}): choose one of {', '.join(OPS)}")
    if format not in ("pftrace", "json"):
        raise ConfigError(f"flight_recorder(format={format!r}): choose pftrace or json")
    for name, value in (("seconds", seconds), ("after_s", after_s)):
        if not isinstance(value, (int, float)) or value < 0 or (name == "seconds" and value == 0):
            raise ConfigError(f"flight_recorder({name}={value!r}): a number of seconds, above 0")


def flight_recorder(seconds: float = 30.0, **options: Any) -> FlightRecorder:
    """Start a :class:`FlightRecorder` (see it for the options) and return it."""
    return FlightRecorder(seconds, **options).start()
