"""Where a flight recorder's captures go, under which names, and how many of them stay.

::

    from polyprof.flight.captures import capture_path, keep_under_caps
    path = capture_path("flight", "slow_step", time.time(), ".pftrace")
    # flight/flight-slow_step-rank3-20261207T101502.123.pftrace (pid<N> outside a launcher)
    kept = keep_under_caps(captures, "flight", max_count=20, max_bytes=1e9)
"""

from __future__ import annotations

import contextlib
import os
import time

from polyprof.flight.job import safe_name
from polyprof.formats.common.paths import launcher_rank


def launched_rank() -> int | None:
    """This process's rank as its launcher (torchrun, SLURM, MPI) set it, or None."""
    launched = launcher_rank()
    return launched[0] if launched else None


def who() -> str:
    """This process in a capture's name: ``rank<R>`` under a launcher, else ``pid<N>``."""
    rank = launched_rank()
    return f"rank{rank}" if rank is not None else f"pid{os.getpid()}"


def capture_path(out_dir: str, trigger: str, wall: float, suffix: str) -> str:
    """The file of a capture `trigger` asked for at `wall` (epoch seconds, to the millisecond)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(wall)) + f".{int(wall * 1e3) % 1000:03d}"
    return os.path.join(out_dir, f"flight-{safe_name(trigger)}-{who()}-{stamp}{suffix}")


def keep_under_caps(captures: list[str], out_dir: str, max_count: int | None, max_bytes: float | None) -> list[str]:
    """`captures` (oldest first) less those in `out_dir` beyond `max_count` or `max_bytes`, removed
    from disk oldest first with the stacks beside them; one written elsewhere (``capture --last -o``)
    is the user's file: kept and not counted."""
    kept: list[str] = []
    total = 0
    for path in reversed(captures):
        if os.path.dirname(path) != out_dir:
            kept.append(path)
            continue
        try:
            size = os.stat(path).st_size
        except OSError:
            continue  # removed by someone else
        over_count = max_count is not None and len(kept) >= max_count
        over_bytes = max_bytes is not None and kept and total + size > max_bytes
        if over_count or over_bytes:
            for gone in (path, f"{path}.stacks.txt"):
                with contextlib.suppress(OSError):
                    os.remove(gone)
            continue
        kept.append(path)
        total += size
    return kept[::-1]
