"""Collection paused by group inside recording windows (torch.profiler's
``toggle_collection_dynamic``): the intervals each backend was off, which the merge leaves out and
counts. A pause that is still on when a window ends goes on into the next window.

::

    pauses = Pauses()
    pauses.toggle(["cuda"], enable=False, now=t0)
    pauses.toggle(["cuda"], enable=True, now=t1)
    pauses.take(window_end)          # {"cuda": [(t0, t1)]}, and nothing kept for the next window
"""

from __future__ import annotations

from collections.abc import Iterable


class Pauses:
    """See the module docstring."""

    def __init__(self) -> None:
        self._done: dict[str, list[tuple[int, int]]] = {}  # backend -> [start, end) collection off
        self._since: dict[str, int] = {}  # backend -> when its pause that is still on began

    def toggle(self, backends: Iterable[str], enable: bool, now: int) -> None:
        """Pause (``enable=False``) or resume `backends` at `now`; a repeated call changes nothing."""
        for name in backends:
            if not enable and name not in self._since:
                self._since[name] = now
            elif enable and name in self._since:
                self._done.setdefault(name, []).append((self._since.pop(name), now))

    def take(self, window_end: int) -> dict[str, list[tuple[int, int]]]:
        """The intervals of the window ending at `window_end`; pauses still on go on from there."""
        for name, since in self._since.items():
            self._done.setdefault(name, []).append((since, window_end))
        self._since = dict.fromkeys(self._since, window_end)
        taken, self._done = self._done, {}
        return taken
