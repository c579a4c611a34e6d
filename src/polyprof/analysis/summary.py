"""Top activities by total time, per kind and device.

::

    from polyprof.analysis import summarize
    for row in summarize(trace, top=5):
        print(row.device, row.kind, row.name, row.count, row.total_ns)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyprof.model import ActivityKind, Trace
from polyprof.model.work import device_heading


@dataclass(frozen=True)
class SummaryRow:
    device: str
    kind: str
    name: str
    count: int
    total_ns: int
    mean_ns: float
    min_ns: int
    max_ns: int
    share: float  # of the total time of this (device, kind) group


def summarize(trace: Trace, top: int = 10) -> list[SummaryRow]:
    """The `top` names by total duration within each (device, kind) group, groups ordered by device
    then by total time. Instant events are not counted."""
    acts = trace.activities
    if not len(acts):
        return []
    kind = acts["kind"].astype(np.int64)
    keep = kind != int(ActivityKind.INSTANT)
    device = acts["device"].astype(np.int64)[keep]
    kind = kind[keep]
    name = acts["name"].astype(np.int64)[keep]
    dur = (acts["end"] - acts["start"])[keep]
    if not len(dur):
        return []
    n_names = max(len(acts.strings), 1)
    key = (device * 64 + kind) * n_names + name
    uniq, inverse = np.unique(key, return_inverse=True)
    totals = np.bincount(inverse, weights=dur).astype(np.int64)
    counts = np.bincount(inverse)
    mins = np.full(len(uniq), np.iinfo(np.int64).max)
    maxs = np.zeros(len(uniq), dtype=np.int64)
    np.minimum.at(mins, inverse, dur)
    np.maximum.at(maxs, inverse, dur)
    group = uniq // n_names
    rows: list[SummaryRow] = []
    group_order = sorted(
        np.unique(group).tolist(),
        key=lambda g: (trace.devices[g // 64].sort_index, g // 64, -int(totals[group == g].sum())),
    )
    for g in group_order:
        idx = np.flatnonzero(group == g)
        group_total = int(totals[idx].sum()) or 1
        idx = idx[np.argsort(-totals[idx], kind="stable")][:top]
        heading = device_heading(trace, g // 64)
        for i in idx.tolist():
            rows.append(
                SummaryRow(
                    device=heading,
                    kind=ActivityKind(g % 64).name.lower(),
                    name=acts.strings[int(uniq[i] % n_names)],
                    count=int(counts[i]),
                    total_ns=int(totals[i]),
                    mean_ns=float(totals[i]) / int(counts[i]),
                    min_ns=int(mins[i]),
                    max_ns=int(maxs[i]),
                    share=int(totals[i]) / group_total,
                )
            )
    return rows
