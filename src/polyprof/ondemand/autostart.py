"""Run by polyprof's ``.pth`` file at interpreter start when ``POLYPROF_ON_DEMAND`` is set (and not
"0"): the process listens for captures. A failure is said on stderr and never stops the program."""

from __future__ import annotations

import sys


def _start() -> None:
    try:
        from polyprof.ondemand.listener import listen

        listen()
    except Exception as exc:
        print(f"polyprof: POLYPROF_ON_DEMAND is set but this process cannot be made capturable: {exc}", file=sys.stderr)


_start()
