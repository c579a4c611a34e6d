"""What makes the flight recorder write: a slow step, a hang, a signal, an uncaught exception. Each
calls back into the recorder with the trigger's name and its evidence (a dict that goes into the
trace's metadata); none raises into the program.

::

    slow = SlowSteps(multiple=3.0, absolute_s=None, fire=recorder_trigger)   # fire(name, evidence)
    slow.step_ended(step, now)            # at each step boundary (monotonic seconds)
    hang = HangWatchdog(300.0, fire); hang.start(); hang.beat(now)
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import os
import re
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from polyprof.formats.common.paths import new_private_file

#: steps the rolling median is taken over, and the least before a step is judged against it
WINDOW_STEPS, MIN_STEPS = 50, 5

Fire = Callable[[str, dict[str, Any]], Any]


class SlowSteps:
    """A step longer than `multiple` times the median of the last steps and `min_excess_s` above it
    (once there are enough of them: jitter of a few milliseconds on millisecond steps is no event), or
    longer than `absolute_s`, fires ``slow_step`` with the step, its time and the median."""

    def __init__(self, multiple: float | None, absolute_s: float | None, fire: Fire, min_excess_s: float = 0.05) -> None:
        self.multiple, self.absolute_s, self.fire = multiple, absolute_s, fire
        self.min_excess_s = min_excess_s
        self.recent: collections.deque[float] = collections.deque(maxlen=WINDOW_STEPS)
        self.last: float | None = None

    def step_ended(self, step: int, now: float, excused_s: float = 0.0) -> None:
        """`excused_s`: how long a capture was being written during this step (the recorder's own doing,
        not the program's: taken off the step's time before it is judged and counted)."""
        last, self.last = self.last, now
        if last is None:
            return
        took = max(0.0, now - last - excused_s)
        median = statistics.median(self.recent) if len(self.recent) >= MIN_STEPS else None
        self.recent.append(took)
        limits = []
        if self.multiple is not None and median is not None:
            limits.append(max(self.multiple * median, median + self.min_excess_s))
        if self.absolute_s is not None:
            limits.append(self.absolute_s)
        if limits and took > min(limits):
            self.fire("slow_step", {"step": step, "step_s": round(took, 6), "threshold_s": round(min(limits), 6),
                                    "median_s": None if median is None else round(median, 6)})


class HangWatchdog:
    """A thread that fires ``hang`` when no step boundary came for `after_s` seconds (once per
    silence: a new boundary re-arms it), from the first step on (before it, a program loads data,
    compiles, waits for its peers: no step has set the pace yet). It runs whenever the interpreter lets it: while the training
    thread waits in C (a collective, a sleep, I/O) it does. While that thread holds the GIL in C code
    that never lets it go, no Python thread runs, and what comes out is every thread's Python stack,
    written by faulthandler's timer (a C thread that needs no GIL) into `stacks_path`."""

    def __init__(self, after_s: float, fire: Fire) -> None:
        self.after_s, self.fire = float(after_s), fire
        self.last = time.monotonic()
        self.steps = 0
        self.fired = False
        self.stacks_path: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks: Any = None
        self._armed_at = 0.0

    def start(self, stacks_path: str | None = None) -> None:
        self.last = time.monotonic()
        if stacks_path is not None:
            try:
                os.makedirs(os.path.dirname(stacks_path) or ".", exist_ok=True)
                self._stacks = os.fdopen(new_private_file(stacks_path), "w")  # (faulthandler writes to it later)
                self.stacks_path = stacks_path
            except OSError:
                self._stacks = None
        self._thread = threading.Thread(target=self._watch, name="polyprof-flight-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._stacks is not None:
            with contextlib.suppress(Exception):
                faulthandler.cancel_dump_traceback_later()
            self._stacks.close()
            with contextlib.suppress(OSError):
                if self.stacks_path and os.path.getsize(self.stacks_path) == 0:
                    os.unlink(self.stacks_path)  # never written: no hang
            self._stacks = None

    def _arm(self, now: float) -> None:
        """faulthandler's timer set again (at most once a second: it restarts a C thread)."""
        if self._stacks is None or now - self._armed_at < 1.0 and self._armed_at:
            return
        self._armed_at = now
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback_later(self.after_s + 1.0, repeat=False, file=self._stacks, exit=False)

    def beat(self, now: float) -> None:
        # a silence the watchdog could not see (no Python thread ran: the GIL was held) is seen here
        self._fire_if_silent(now, seen="at the next step: no Python thread ran meanwhile")
        self.last, self.fired = now, False
        self.steps += 1
        self._arm(now)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.after_s / 4)):
            self._fire_if_silent(time.monotonic())

    def _fire_if_silent(self, now: float, **said: str) -> None:
        """``hang``, once per silence, when no step came for `after_s` (from the first step on)."""
        silent = now - self.last
        if self.steps and silent >= self.after_s and not self.fired:
            self.fired = True
            self.fire("hang", {"silent_s": round(silent, 3), "steps_before": self.steps,
                               "threshold_s": self.after_s, **said})

    @staticmethod
    def write_stacks(trace_path: str) -> str | None:
        """Every thread's Python stack beside a capture (``<trace>.stacks.txt``), from this thread."""
        path = f"{trace_path}.stacks.txt"
        try:
            with os.fdopen(new_private_file(path), "w") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError:
            return None
        return path


class SignalTriggers:
    """The signals named (SIGUSR2, SIGTERM, SIGINT, ...) capture as they come: SIGUSR2 through
    `capture_later` (the writer thread: the program goes on at once), the others on the main thread,
    which then do what they did before (the previous handler, or the default: the process ends by the
    signal)."""

    def __init__(self, names: tuple[str, ...], capture_now: Fire, before_ending: Callable[[], Any] | None = None,
                 busy: Callable[[], bool] | None = None, capture_later: Fire | None = None) -> None:
        self.names, self.capture_now, self.before_ending, self.busy = names, capture_now, before_ending, busy
        self.capture_later = capture_later
        self.previous: dict[int, Any] = {}

    #: how long the signal thread leaves a stopping signal to the main thread's handler
    MAIN_THREAD_GRACE_S = 1.0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers are the main thread's to set
        for name in self.names:
            number = getattr(signal, name, None)
            if number is None:
                continue
            self.previous[number] = signal.signal(number, self._on_signal)
        self._watch_wakeups()

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for number, previous in self.previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self.previous.clear()
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(ValueError, OSError):
                current = signal.set_wakeup_fd(-1)
                if current != pipe[1]:
                    signal.set_wakeup_fd(current)  # (set by the program since: left as it is)
            os.close(pipe[1])  # (the thread reads the end of the pipe, and closes the other end)

    # A Python handler runs on the main thread between bytecodes: a main thread blocked in C (a gloo or
    # NCCL collective waiting for a peer that died) never runs it, and torchrun's SIGKILL follows. The
    # interpreter's own C handler also writes each signal's number to the wakeup fd at once: a thread of
    # ours reads it, and where the main thread has not begun handling a stopping signal within
    # MAIN_THREAD_GRACE_S, captures and ends the process itself. (A program that sets its own wakeup fd,
    # asyncio's loop, keeps it: the main thread's handler alone then, as before.)
    _pipe: tuple[int, int] | None = None
    _began = threading.Event()  # the main thread's handler began with a stopping signal

    def _watch_wakeups(self) -> None:
        stopping = {n for n in self.previous if n in (signal.SIGTERM, signal.SIGINT)}
        if not stopping or self._pipe is not None:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            before = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError):
            before = None
        if before != -1:  # someone else's (or none could be set): left as it was
            if before is not None:
                signal.set_wakeup_fd(before)
            os.close(read_end)
            os.close(write_end)
            return
        self._pipe = (read_end, write_end)
        self._began = threading.Event()
        threading.Thread(target=self._read_wakeups, args=(read_end, stopping), name="polyprof-flight-signals",
                         daemon=True).start()

    def _read_wakeups(self, read_end: int, stopping: set[int]) -> None:
        try:
            while True:
                data = os.read(read_end, 64)
                if not data:
                    return
                for number in data:
                    if number in stopping and not self._began.wait(self.MAIN_THREAD_GRACE_S):
                        self._end_for_a_blocked_main_thread(number)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(read_end)

    def _end_for_a_blocked_main_thread(self, number: int) -> None:
        """`number` (SIGTERM, SIGINT) came and the main thread did not handle it (blocked in C): the
        capture is written here, then the process ends by the signal, where ending is what it did."""
        name = signal.Signals(number).name
        self.capture_now("signal", {"signal": name, "main_thread": "blocked outside Python: written by the signal thread"})
        if self.previous.get(number) not in (None, signal.SIG_DFL) or self._began.is_set():
            return  # a handler of the program's own runs when the main thread can; or the main thread took over
        if self.before_ending is not None:
            with contextlib.suppress(Exception):
                self.before_ending()
        import ctypes

        ctypes.CDLL(None).signal(number, 0)  # SIG_DFL, from a thread (signal.signal is the main thread's)
        os.kill(os.getpid(), number)

    #: a signal that came while the main thread was writing a capture: it ends the process once written
    pending: int | None = None

    def _on_signal(self, number: int, frame: Any) -> None:
        name = signal.Signals(number).name
        if number != getattr(signal, "SIGUSR2", None):
            self._began.set()
        if self.busy is not None and self.busy():
            if number != getattr(signal, "SIGUSR2", None):
                self.pending = number  # (the capture under way on this thread is this failure's)
            return
        if number == getattr(signal, "SIGUSR2", None) and self.capture_later is not None:
            self.capture_later("signal", {"signal": name})  # (the program goes on: written off its thread)
            return
        self.capture_now("signal", {"signal": name})
        if number == getattr(signal, "SIGUSR2", None):
            return
        self.end_as_signalled(number, frame)

    def end_as_signalled(self, number: int, frame: Any = None) -> None:
        """What `number` did before the capture: the previous handler, or the default (the process ends
        by the signal, its files tidied first)."""
        previous = self.previous.get(number)
        if callable(previous):
            previous(number, frame)
            return
        if previous == signal.SIG_IGN:
            return
        self.uninstall()
        if self.before_ending is not None:
            self.before_ending()
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)  # ends the process as the signal would have


#: what gloo's and NCCL's collective timeouts say ("Timed out waiting 2000ms for recv operation",
#: "Watchdog caught collective operation timeout: WorkNCCL(...)")
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_COLLECTIVE = re.compile(r"gloo|nccl|c10d|ProcessGroup|collective", re.IGNORECASE)


def collective_timeout(exc_type: Any, value: Any) -> str | None:
    """The backend ("gloo", "nccl", or "c10d") where an exception is a collective that timed out."""
    text = f"{exc_type.__name__}: {value}"
    if not _TIMEOUT.search(text) or not (_COLLECTIVE.search(text) or exc_type.__name__.startswith("Dist")):
        return None
    lower = text.lower()
    return "nccl" if "nccl" in lower else "gloo" if "gloo" in lower else "c10d"


class ExitHooks:
    """An uncaught exception on the main thread (or on another thread) captures before the program
    ends (``exception``, with its type and message; ``collective_timeout`` where it is a collective
    that timed out, gloo's or NCCL's, with the backend too), then the previous hooks run; so does
    ``sys.exit`` with a failing status (``exit``, with the status; a status of 0 or None is a program
    that finished)."""

    def __init__(self, capture_now: Fire) -> None:
        self.capture_now = capture_now
        self._sys_hook: Any = None
        self._thread_hook: Any = None
        self._sys_exit: Any = None

    def install(self) -> None:
        self._sys_hook, sys.excepthook = sys.excepthook, self._on_exception
        self._thread_hook, threading.excepthook = threading.excepthook, self._on_thread_exception
        self._sys_exit, sys.exit = sys.exit, self._on_exit

    def uninstall(self) -> None:
        if sys.excepthook == self._on_exception:
            sys.excepthook = self._sys_hook
        if threading.excepthook == self._on_thread_exception:
            threading.excepthook = self._thread_hook
        if sys.exit == self._on_exit:
            sys.exit = self._sys_exit

    def _on_exit(self, status: Any = None) -> None:
        if status not in (None, 0):
            with contextlib.suppress(Exception):
                self.capture_now("exit", {"status": status if isinstance(status, int) else str(status)[:2000]})
        self._sys_exit(status)

    def _capture(self, exc_type: Any, value: Any, thread: str) -> None:
        if exc_type is None or issubclass(exc_type, (SystemExit, KeyboardInterrupt)):
            return  # an exit asked for, or Ctrl-C (SIGINT's trigger writes that one)
        with contextlib.suppress(Exception):
            evidence = {"type": exc_type.__name__, "message": str(value)[:2000], "thread": thread}
            backend = collective_timeout(exc_type, value)
            if backend is None:
                self.capture_now("exception", evidence)
            else:
                self.capture_now("collective_timeout", {**evidence, "backend": backend})

    def _on_exception(self, exc_type: Any, value: Any, tb: Any) -> None:
        self._capture(exc_type, value, threading.current_thread().name)
        (self._sys_hook or sys.__excepthook__)(exc_type, value, tb)

    def _on_thread_exception(self, args: Any) -> None:
        self._capture(args.exc_type, args.exc_value, getattr(args.thread, "name", "?"))
        (self._thread_hook or threading.__excepthook__)(args)


class CrashStacks:
    """faulthandler on for the fatal signals (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL), writing every
    thread's Python stack into a file of its own; left as it was where the program turned faulthandler
    on itself. :meth:`close` turns it off again and removes the file if nothing was written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: Any = None
        if faulthandler.is_enabled():
            return  # the program's own (python -X faulthandler, PYTHONFAULTHANDLER): left alone
        try:
            self.file = os.fdopen(new_private_file(path), "w")  # (faulthandler writes to it at a crash)
            faulthandler.enable(file=self.file, all_threads=True)
        except (OSError, RuntimeError):
            self.file = None

    def close(self) -> None:
        if self.file is None:
            return
        with contextlib.suppress(Exception):
            faulthandler.disable()
        self.file.close()
        with contextlib.suppress(OSError):
            if os.path.getsize(self.path) == 0:
                os.unlink(self.path)
        self.file = None


class CrashRows:
    """At a fatal signal the C recorder writes every thread's spans and instants not yet handed over, and
    the torch observer its operators, to `path` (beside the spill: ``SPILL.crash``) with write(2) alone,
    async-signal-safely; ``polyprof recover SPILL`` reads it with the spill. Armed before :class:`CrashStacks` (faulthandler), so that at
    a crash the stacks are written first, then the rows; :meth:`close` after it. Without the C
    extension nothing is armed: the spill's last hand-over is what a crash leaves. `tidy`: a file the
    crash removes if it is still empty (the hang watchdog's stacks: no hang came)."""

    def __init__(self, path: str, tidy: str | None = None) -> None:
        from polyprof import _native

        self.path = path
        self.fd: int | None = None
        self._unhook: Callable[[], Any] | None = None
        if _native.extension_missing:
            return
        try:
            self.fd = new_private_file(path)
            _native.crash_rows_arm(self.fd, _observer_crash_rows(), tidy or "")
        except OSError:
            self.close()
            return
        from polyprof.torch import observer

        # torch imported after the recorder started (polyprof run, the start-up hook): its operators too
        self._unhook = observer.when_loaded(self._take_observer)

    def _take_observer(self, loaded: Any) -> None:
        from polyprof import _native

        if self.fd is not None:
            _native.crash_rows_arm(self.fd, loaded.crash_rows_address())

    def close(self) -> None:
        from polyprof import _native

        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        if self.fd is None:
            return
        _native.crash_rows_disarm()
        os.close(self.fd)
        self.fd = None
        with contextlib.suppress(OSError):
            if os.path.getsize(self.path) == 0:
                os.unlink(self.path)


def _observer_crash_rows() -> int:
    """The torch observer's crash writer (its ops since the last hand-over), where one is loaded."""
    if "torch" not in sys.modules:
        return 0
    from polyprof.torch import observer

    loaded = observer.loaded_observers()
    return loaded[-1].crash_rows_address() if loaded else 0


class CudaOutOfMemory:
    """On CUDA, torch's out-of-memory observer (called as the caching allocator fails, before torch
    raises OutOfMemoryError) fires ``oom`` with the device and the sizes. Attached at the first step
    after CUDA is in use (asking whether CUDA is available earlier would start it in the process, which
    a DataLoader's forked workers cannot inherit); torch offers no detach, so it goes quiet once
    :meth:`quiet` is called."""

    def __init__(self, fire: Fire) -> None:
        self.fire = fire
        self.attached = False
        self._on = True

    def attach_if_cuda_is_in_use(self) -> bool:
        torch = sys.modules.get("torch")
        if self.attached or torch is None:
            return self.attached
        try:
            if not torch.cuda.is_initialized():
                return False
            torch._C._cuda_attach_out_of_memory_observer(self._observed)
        except Exception:  # noqa: BLE001 - a torch without the hook: no oom trigger
            return False
        self.attached = True
        return True

    def quiet(self) -> None:
        self._on = False

    def _observed(self, device: int, asked: int, allocated: int, free: int) -> None:
        if self._on:
            self.fire("oom", {"device": device, "bytes_asked": asked, "device_allocated": allocated,
                              "device_free": free})
