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
