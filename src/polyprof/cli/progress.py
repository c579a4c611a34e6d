"""The command line's progress bars (rich: units done, rate, time left), on stderr when it is a
terminal; nothing at all when it is not, or with ``--quiet``. Library code reports through
:mod:`polyprof.progress`::

    with shown(quiet):
        stats = write_store(files, out)        # its tasks appear as bars
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from polyprof import progress
from polyprof.cli.render import new_console

#: the option every command with a bar takes
QUIET = click.option("-q", "--quiet", is_flag=True, help="No progress bar (there is none when stderr is not a terminal).")


@contextlib.contextmanager
def shown(quiet: bool = False) -> Iterator[None]:
    """Bars for the tasks library code starts inside the block (see the module docstring)."""
    console = new_console(stderr=True)
    if quiet or not console.is_terminal:
        yield
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    byte_columns = (TextColumn("{task.description}"), BarColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:

        def make_task(description: str, total: float) -> progress.Advance:
            if description.endswith("bytes"):
                bar.columns = byte_columns
            task_id = bar.add_task(description, total=total)
            return lambda amount: bar.advance(task_id, amount)

        with progress.listening(make_task):
            yield
