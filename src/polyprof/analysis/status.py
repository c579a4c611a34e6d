"""What the trace itself says: each backend's status, and the counters over time.

::

    backends_table(trace)     # backend, state, activities, dropped, rejected, errors, warnings, clock
    counters_table(trace)     # counter, device, samples, min, max, mean, last
    counter_series(trace)     # {counter name: (ts ns array, values array)}
"""

from __future__ import annotations

import numpy as np

from polyprof.analysis.table import Table
from polyprof.model import Trace


def _clock_uncertainty(clock: dict) -> str:
    parts = []
    for key, value in clock.items():
        if isinstance(value, dict):
            u = value.get("uncertainty_ns", value.get("residual_ns"))
            if isinstance(u, (int, float)):
                parts.append(f"{key}: ±{u / 1000:.1f} us")
    return "; ".join(parts)


def backends_table(trace: Trace) -> Table:
    rows = []
    for name, st in trace.backends.items():
        dropped = ", ".join(f"{k} {v}" for k, v in st.dropped.items())
        rows.append((name, st.state, st.activities, dropped, st.rejected, "; ".join(st.errors), "; ".join(st.warnings),
                     st.reason, _clock_uncertainty(st.clock)))
    return Table.of(("backend", "state", "activities", "dropped", "rejected", "errors", "warnings", "reason", "clock"),
                    rows, "Backends")


def counter_series(trace: Trace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    cols = trace.counters.columns
    if not len(cols.get("ts", ())):
        return {}
    names = trace.counters.strings.strings
    out = {}
    for code in np.unique(cols["name"]).tolist():
        m = cols["name"] == code
        order = np.argsort(cols["ts"][m], kind="stable")
        out[names[code]] = (cols["ts"][m][order], cols["value"][m][order].astype(float))
    return out


def counters_table(trace: Trace) -> Table:
    rows = []
    for name, (_ts, values) in counter_series(trace).items():
        rows.append((name, len(values), float(values.min()), float(values.max()), float(values.mean()), float(values[-1])))
    return Table.of(("counter", "samples", "min", "max", "mean", "last"), rows, "Counters")
