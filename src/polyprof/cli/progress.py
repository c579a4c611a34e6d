"""A progress bar for commands that can run long (files and bytes done, rate, time left), on stderr
when it is a terminal; nothing at all when it is not, or with ``--quiet``::

    with progress("converting ranks", total=len(files), quiet=quiet) as advance:
        for f in files:
            convert(f)
            advance(1)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from polyprof.cli.render import new_console


@contextlib.contextmanager
def progress(description: str, total: float, quiet: bool = False) -> Iterator[Callable[[float], None]]:
    """Yields ``advance(amount)``; shows the bar only on a terminal and without `quiet`."""
    console = new_console(stderr=True)
    if quiet or not console.is_terminal:
        yield lambda amount: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda amount: bar.advance(task, amount)
