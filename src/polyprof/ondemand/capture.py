"""One capture at a time in a capturable process: start, stop, write the trace, say how it went.

::

    capture = Capture(request, output, done=reply)   # output: the checked path; done(reply) once, at the end
    capture.begin()                                   # by duration: records now; by steps: at the next step

A capture by steps starts at a step boundary (:mod:`polyprof.torch.steps`) on the training thread and records
``request.steps`` steps, each a ``ProfilerStep#N`` span (N counts the process's steps from 0); one by
duration starts at once (or at an agreed step, for a job). Ops of every thread are recorded
(``profile_all_threads``), since the capture is started by polyprof's threads as often as by the
training one. Stopping only stops the recorders: merging and writing run on a thread of their own, so
the training thread waits for nothing more. While it records, the capture spills beside its output
(a process killed mid-capture leaves a trace for ``polyprof recover``); a process that exits mid-capture
writes the trace on its way out.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from polyprof.model.steps import step_number
from polyprof.ondemand.protocol import CaptureRequest, error_reply
from polyprof.torch.steps import tracker

log = logging.getLogger("polyprof.ondemand")

Reply = Callable[[dict[str, Any]], None]


class Capture:
    def __init__(self, request: CaptureRequest, output: str, done: Reply, *, start_step: int | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        from polyprof.engine.scheduled import Profile
        from polyprof.formats.spill.file import spill_path

        self.request, self.output, self._done = request, output, done
        self.start_step = start_step
        self.first_step: int | None = None
        self.started_at: float | None = None
        self.notes: list[str] = []
        self._lock = threading.Lock()
        self._finished = False
        self._timers: list[threading.Timer] = []
        self.profile = Profile(
            list(request.activities) if request.activities else None,
            spill=spill_path(output),
            record_steps=request.steps is not None,
            extra={"profile_all_threads": True},
            metadata={"polyprofCapture": {**request.describe(), **(metadata or {})}},
        )

    @property
    def running(self) -> bool:
        return self.started_at is not None and not self._finished

    def describe(self) -> dict[str, Any]:
        return {**self.request.describe(), "output": self.output, "recording": self.running,
                "start_step": self.start_step, "first_step": self.first_step}

    def begin(self) -> None:
        """Start now (by duration, no step agreed) or arm for the step boundary."""
        if self.request.steps is None and self.start_step is None:
            self._start(None)
            return
        tracker.add_listener(self._on_step)
        self._after(self.request.timeout_s, self._no_step)

    def _after(self, seconds: float, fn: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, fn)
        timer.daemon = True
        timer.name = "polyprof-capture-timer"
        self._timers.append(timer)
        timer.start()

    def _no_step(self) -> None:
        if self.started_at is None:
            self.finish(
                f"no step boundary came within {self.request.timeout_s:g} s: this process made no optimizer step "
                "and called no polyprof.profiler profile.step() that polyprof could see; capture it by duration "
                "(polyprof capture PID --duration S)"
            )

    def _on_step(self, step: int) -> None:
        """At each new step, on the training thread."""
        if self._finished:
            return
        try:
            if self.started_at is None:
                if self.start_step is None:
                    self.start_step = step
                elif step > self.start_step:
                    self.notes.append(f"asked to start at step {self.start_step}, started late, at step {step}")
                if step >= self.start_step:
                    self._start(step)
                return
            if self.request.steps is not None:
                if step >= (self.first_step or 0) + self.request.steps:
                    self.finish()
                else:
                    self.profile.step_num = step - 1
                    self.profile.step()
        except Exception as exc:  # never the training loop's problem
            log.exception("polyprof on-demand: the capture failed at step %d", step)
            self.finish(f"the capture failed at step {step}: {type(exc).__name__}: {exc}")

    def _start(self, step: int | None) -> None:
        if step is not None:
            self.profile.step_num = step
            self.first_step = step
        self.profile.start()
        self.started_at = time.time()
        self.profile.add_metadata("polyprofCaptureStart", {"after_step": tracker.step if step is None else step,
                                                           "unix_time": round(self.started_at, 6)})
        if self.request.duration_s is not None:
            self._after(self.request.duration_s, self.finish)

    def _claim_end(self) -> bool:
        """The one caller that ends the capture (True), its step listener and timers gone."""
        with self._lock:
            if self._finished:
                return False
            self._finished = True
        tracker.remove_listener(self._on_step)
        for timer in self._timers:
            timer.cancel()
        return True

    def finish(self, error: str = "") -> None:
        """Stop (once) and write the trace on a thread of its own; `error`: why the capture ends without
        one, when it never started."""
        if not self._claim_end():
            return
        if self.started_at is None:
            self._reply(error_reply(error or "the capture was cancelled before it started"))
            return
        try:
            self.profile.stop(wait=False)
        except Exception as exc:
            log.exception("polyprof on-demand: stopping the capture failed")
            self.notes.append(f"stopping reported {type(exc).__name__}: {exc}")
        exporter = threading.Thread(target=self._export, name="polyprof-capture-export")
        exporter.start()  # not a daemon: an interpreter that exits now waits for the trace

    def finish_at_exit(self) -> None:
        """The process is exiting mid-capture: stop and write the trace here, on the exiting thread."""
        if not self._claim_end():
            return
        if self.started_at is None:
            self._reply(error_reply("the process exited before the capture started"))
            return
        self.notes.append("the process exited mid-capture: the trace covers up to its exit")
        try:
            self.profile.stop()
        except Exception as exc:
            self.notes.append(f"stopping reported {type(exc).__name__}: {exc}")
        self._export()

    def _export(self) -> None:
        try:
            if self.notes:
                self.profile.add_metadata("polyprofCaptureNotes", self.notes)
            written = self.profile.export_chrome_trace(self.output)
            trace = self.profile.trace
            steps = sorted(n for n in map(step_number, set(trace.activities.names())) if n is not None)
            self._reply({"ok": True, "done": {
                "path": written, "activities": len(trace.activities), "notes": self.notes,
                "steps": [steps[0], steps[-1]] if steps else None,
                "seconds": round(time.time() - (self.started_at or time.time()), 3),
            }})
        except Exception as exc:  # said in one line here, and to the CLI: never a traceback in the target
            log.error("polyprof on-demand: the capture's trace was not written to %s: %s: %s", self.output,
                      type(exc).__name__, exc)
            spill = self.profile.spill_path
            self._reply(error_reply(f"the trace was not written: {type(exc).__name__}: {exc} (what was recorded "
                                    f"is kept, readable by you only: polyprof recover {spill})"))

    def _reply(self, message: dict[str, Any]) -> None:
        try:
            self._done(message)
        except Exception:
            log.exception("polyprof on-demand: reporting the capture's end failed")


class CaptureSlot:
    """The process's one capture slot: a second capture while one runs is refused with the reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Capture | None = None
        atexit.register(self._at_exit)

    def take(self, make: Callable[[Reply], Capture], done: Reply) -> Capture:
        """A new capture made by `make(done_and_release)`; RuntimeError (the reason) when one runs."""
        with self._lock:
            if self.current is not None:
                since = self.current.started_at
                raise RuntimeError(
                    f"a capture is already running in this process ({self.current.request.describe()}"
                    + (f", recording for {time.time() - since:.0f} s" if since else ", waiting for its start step")
                    + "); ask again when it is done"
                )

            def release(message: dict[str, Any]) -> None:
                with self._lock:
                    if self.current is capture:
                        self.current = None
                done(message)

            capture = make(release)
            self.current = capture
            return capture

    def status(self) -> dict[str, Any] | None:
        current = self.current
        return current.describe() if current is not None else None

    def _at_exit(self) -> None:
        current = self.current
        if current is not None:
            current.finish_at_exit()

    def forget(self) -> None:
        """In a forked child: the parent's capture is not this process's."""
        self._lock = threading.Lock()
        self.current = None
