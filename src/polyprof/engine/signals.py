"""Turning the signals a scheduler or a terminal sends into a clean stop.

``timeout``, ``docker stop``, Slurm and Kubernetes send SIGTERM, a closed terminal SIGHUP, Ctrl-C
SIGINT. While :class:`CleanStop` is installed, SIGTERM and SIGHUP become an exception in the main thread
that unwinds the profiled program like Ctrl-C does (SIGINT stays KeyboardInterrupt); once the trace is
written, :meth:`CleanStop.exit` ends the process with the signal's own status (as if it had not been
caught). Once one has been raised in the program, and while the trace is written
(:meth:`CleanStop.deferred`), all three only are noted, Ctrl-C included, so that a second signal cannot
cut the file short (nor land between the program's end and the writing)::

    with CleanStop() as stop:
        try:
            run_the_program()
        except Signalled:
            pass
        with stop.deferred():       # a signal while the trace is written waits until it is
            write_the_trace()
    stop.exit()                      # no-op when no signal came
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

HANDLED = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
INTERRUPT = signal.SIGINT


class Signalled(BaseException):
    """A handled signal arrived (a BaseException, as KeyboardInterrupt: ``except Exception`` in the
    program does not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class CleanStop:
    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal that came
        self._raised = False  # whether it has been raised in the program already
        self._defer = 0
        self._exiting = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> CleanStop:
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
            if signal.getsignal(INTERRUPT) is signal.default_int_handler:  # a program's own handler is left alone
                self._previous[INTERRUPT] = signal.signal(INTERRUPT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.signum is not None and self._raised:  # exit() is to come: a further signal only waits for it
            self._exiting = True
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self._exiting:  # the trace is written and the process about to end as the first signal asks
            return
        if self._defer or self._raised:  # the trace is being written, or is next: only note it
            if self.signum is None:
                self.signum = signum
            return
        if signum == INTERRUPT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
        if not self._raised:
            self._raised = True
            raise Signalled(signum)

    def interrupted(self) -> None:
        """A KeyboardInterrupt ended the program: end with SIGINT's status, as Python would."""
        if self.signum is None:
            self.signum = signal.SIGINT
        self._raised = True

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals in this block are noted, not raised: the trace being written is not cut short. One
        that came meanwhile is raised when the block ends."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1
        if not self._defer and self.signum is not None and not self._raised:
            self._raised = True
            raise Signalled(self.signum)

    def exit(self) -> None:
        """End the process as the noted signal would have (default action), if one came."""
        if self.signum is None:
            return
        for other in (*HANDLED, INTERRUPT):  # a further signal (a second Ctrl-C) must not cut the exit short
            if other != self.signum and threading.current_thread() is threading.main_thread():
                signal.signal(other, signal.SIG_IGN)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)
        sys.exit(128 + self.signum)  # where the default action does not end the process

    def end_with(self, end: Callable[[], Any]) -> None:
        """Run `end` (a profile's stop) where a signal meanwhile waits until it is done, then end the
        process as the first signal asked (nothing happens when none came)."""
        try:
            with self.deferred():  # a second signal does not cut the stop (and the handler's file) short
                end()
        except Signalled:
            pass
        finally:
            self.__exit__()
        self.exit()
