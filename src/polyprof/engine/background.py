"""Merge and write off the training thread.

The call that ends a recording window stops the recorders and hands a job to the writer: one daemon
thread per process that runs jobs in order (collect, seal, merge, the profile's trace-ready work and
its ``on_trace_ready`` handler). The heavy parts release the GIL (numpy, the C formatter, gzip), so
the training loop keeps running. A job's stages are events the front end waits on when the user asks::

    job = writer.submit(run)       # run(job) sets job.collected and job.merged as it gets there
    job.merged.wait()              # prof.trace / export_chrome_trace
    job.done.wait()                # stop() with an on_trace_ready handler still to run

At interpreter exit, pending jobs are finished (their handlers write their files) before Python goes.
"""

from __future__ import annotations

import atexit
import collections
import threading
from collections.abc import Callable
from typing import Any

WRITER_THREAD_NAME = "polyprof-writer"


class Job:
    """One window's work in the background, with its stages as events."""

    __slots__ = ("run", "collected", "merged", "done", "error", "result")

    def __init__(self, run: Callable[[Job], Any]) -> None:
        self.run: Callable[[Job], Any] | None = run
        self.collected = threading.Event()  # the backends handed over (their next window may start)
        self.merged = threading.Event()  # the trace exists
        self.done = threading.Event()  # handlers ran
        self.error: BaseException | None = None
        self.result: Any = None

    def finish(self) -> None:
        # the run closure holds its profile, and the profile keeps its jobs: let go of it once it has run,
        # so that a profile and its trace are freed when the user drops them, not by a later GC pass
        self.run = None
        self.collected.set()
        self.merged.set()
        self.done.set()


class Writer:
    """The process's background writer (see the module docstring). Its thread exists only while there
    is work: it ends when the queue is empty, so an idle process has no polyprof thread (tools that
    sample every thread, such as torch's Python tracer, see none)."""

    def __init__(self) -> None:
        self._queue: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending: set[Job] = set()

    def submit(self, run: Callable[[Job], Any]) -> Job:
        job = Job(run)
        with self._lock:
            self._pending.add(job)
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=WRITER_THREAD_NAME, daemon=True)
                self._thread.start()
        return job

    def _serve(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None  # the next submit starts a new thread
                    return
                job = self._queue.popleft()
            try:
                job.result = job.run(job)
            except BaseException as exc:  # kept for the front end to raise where the user waits
                job.error = exc
            finally:
                job.finish()
                with self._lock:
                    self._pending.discard(job)
            del job

    @property
    def on_writer_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for every pending job; False when `timeout_s` passed first."""
        with self._lock:
            pending = list(self._pending)
        if self.on_writer_thread:
            return not pending
        for job in pending:
            if not job.done.wait(timeout_s):
                return False
        return True


writer = Writer()
atexit.register(writer.drain)


class WindowJobs:
    """One profile's windows still in the background, oldest first, and what they found that the user
    must hear of (warnings, a handler's exception), raised on the user's thread when it next calls in::

        jobs.add(writer.submit(run))     # or jobs.add(run_here(run)) where the caller waits anyway
        jobs.wait_merged()               # prof.trace
        jobs.raise_error()               # step() / stop(): a handler's exception, once
    """

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.warnings: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def add(self, job: Job) -> None:
        self.jobs = [j for j in self.jobs if not j.done.is_set()] + [job]

    @property
    def busy(self) -> bool:
        """Whether a window's job has not finished."""
        return any(not j.done.is_set() for j in self.jobs)

    def wait_collected(self) -> None:
        """Until the last window's backends have handed over (a process-wide recorder may then record
        again); nothing to wait for on the writer itself."""
        if self.jobs and not writer.on_writer_thread:
            self.jobs[-1].collected.wait()

    def wait_merged(self) -> None:
        if self.jobs and not writer.on_writer_thread:
            self.jobs[-1].merged.wait()

    def wait_done(self) -> None:
        if not writer.on_writer_thread:
            for job in list(self.jobs):
                job.done.wait()

    def raise_error(self, merge_only: bool = False) -> None:
        """Raise (once) what a finished job raised: an on_trace_ready handler's exception, or a polyprof
        bug that cost the window its trace (`merge_only`: a job that has merged counts as finished)."""
        for job in self.jobs:
            if job.error is not None and (job.done.is_set() or (merge_only and job.merged.is_set())):
                error, job.error = job.error, None
                self.jobs = [j for j in self.jobs if j is not job]
                raise error

    def emit_warnings(self, warn: Callable[[str], Any]) -> None:
        """Hand the warnings found so far to `warn` (on the user's thread; never on the writer's)."""
        if writer.on_writer_thread:
            return
        while self.warnings:
            warn(self.warnings.pop(0))


def run_here(run: Callable[[Job], Any]) -> Job:
    """`run` as a job on the calling thread (a stop that waits anyway, or a window ended from inside a
    handler on the writer), its error kept for the user as the writer keeps it."""
    job = Job(run)
    try:
        job.result = run(job)
    except BaseException as exc:
        job.error = exc
    finally:
        job.finish()
    return job
