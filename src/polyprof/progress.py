"""Progress of long work (store, convert, merge, loading many traces, recover), reported to whoever
listens: the command line shows a bar on a terminal; a library caller sees nothing unless it listens.

::

    advance = progress.task("ranks", total=len(files))     # in library code: a no-op when nobody listens
    for f in files:
        ...
        advance(1)

    with progress.listening(make_task):                   # the command line: make_task(description, total)
        convert(...)                                       #   returns the advance function of its bar
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

Advance = Callable[[float], None]

_listener: Callable[[str, float], Advance] | None = None
_lock = threading.Lock()


def _ignore(amount: float) -> None:
    pass


def task(description: str, total: float) -> Advance:
    """A piece of work of `total` units (files, ranks, bytes): call what this returns with each amount done."""
    listener = _listener
    if listener is None:
        return _ignore
    advance = listener(description, total)
    lock = threading.Lock()  # (ranks may finish on several threads)

    def locked(amount: float) -> None:
        with lock:
            advance(amount)

    return locked


@contextlib.contextmanager
def listening(make_task: Callable[[str, float], Advance]) -> Iterator[None]:
    """Report every task started inside the block to `make_task(description, total)`."""
    global _listener
    with _lock:
        previous, _listener = _listener, make_task
    try:
        yield
    finally:
        with _lock:
            _listener = previous
