"""Counter samples (a name, a device, a time, a value, optionally a thread), stored as columns and
written as Chrome `C` events::

    c = Counters()
    c.add("queue depth", device=0, ts=1_000, value=3.0)
    c.extend(["power"] * 2, device=np.array([1, 1]), ts=np.array([10, 20]), value=np.array([310.0, 320.5]))
    len(c), c.samples[0].name          # -> 3, 'queue depth'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyprof.model.strings import StringTable

#: (column, dtype); `resource` is -1 for a process-wide counter.
COUNTER_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("name", np.int32),
    ("device", np.int32),
    ("resource", np.int32),
    ("ts", np.int64),
    ("value", np.float64),
)


@dataclass(frozen=True)
class CounterSample:
    """One sample, materialised for inspection."""

    name: str
    device: int  # index into Trace.devices
    ts: int  # host-clock ns
    value: float
    resource: int = -1


class Counters:
    """Columns of counter samples with their own string table. Appending is for producers (a Sink, a
    reader); the merge and the writers read :attr:`columns`."""

    __slots__ = ("strings", "_rows", "_chunks")

    def __init__(self, strings: StringTable | None = None) -> None:
        self.strings = strings or StringTable()
        self._rows: list[tuple[int, int, int, int, float]] = []
        self._chunks: list[dict[str, np.ndarray]] = []

    def add(self, name: str, device: int, ts: int, value: float, resource: int = -1) -> None:
        self._rows.append((self.strings.intern(name), device, resource, ts, value))

    def extend(
        self,
        names: Sequence[str] | str,
        *,
        device: Any,
        ts: Any,
        value: Any,
        resource: Any = -1,
    ) -> None:
        """Many samples at once: `names` is one name for all or one per sample; the rest are arrays
        (or scalars, broadcast)."""
        ts = np.asarray(ts, dtype=np.int64)
        n = len(ts)
        if isinstance(names, str):
            codes = np.full(n, self.strings.intern(names), dtype=np.int32)
        else:
            table = {s: self.strings.intern(s) for s in set(names)}
            codes = np.array([table[s] for s in names], dtype=np.int32)
        self._flush()
        self._chunks.append(
            {
                "name": codes,
                "device": np.broadcast_to(np.asarray(device, dtype=np.int32), n).copy(),
                "resource": np.broadcast_to(np.asarray(resource, dtype=np.int32), n).copy(),
                "ts": ts,
                "value": np.asarray(value, dtype=np.float64).reshape(-1) if n else np.zeros(0),
            }
        )

    def _flush(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows, strict=True))
            self._chunks.append({name: np.array(cols[i], dtype=t) for i, (name, t) in enumerate(COUNTER_COLUMNS)})
            self._rows = []

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """Every sample as columns (``name`` codes into :attr:`strings`)."""
        self._flush()
        if len(self._chunks) > 1:
            self._chunks = [{k: np.concatenate([c[k] for c in self._chunks]) for k, _ in COUNTER_COLUMNS}]
        if not self._chunks:
            return {k: np.zeros(0, dtype=t) for k, t in COUNTER_COLUMNS}
        return self._chunks[0]

    @classmethod
    def from_columns(cls, strings: StringTable, columns: dict[str, np.ndarray]) -> Counters:
        out = cls(strings)
        if len(columns["ts"]):
            out._chunks = [{k: np.asarray(columns[k], dtype=t) for k, t in COUNTER_COLUMNS}]
        return out

    def __len__(self) -> int:
        return len(self._rows) + sum(len(c["ts"]) for c in self._chunks)

    @property
    def samples(self) -> list[CounterSample]:
        """Materialised samples (tests, small traces)."""
        c = self.columns
        names = self.strings.strings
        return [
            CounterSample(names[n], d, t, v, r)
            for n, d, r, t, v in zip(
                c["name"].tolist(), c["device"].tolist(), c["resource"].tolist(), c["ts"].tolist(),
                c["value"].tolist(), strict=True,
            )
        ]
