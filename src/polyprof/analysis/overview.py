"""Every analysis of one trace, computed once, and the findings worth reading first, in words.

::

    from polyprof.analysis.overview import overview
    ov = overview(trace)                  # or overview(traces, ranks=[0, 1]) for a job
    ov.findings                           # ["OpenCL idle 62% of step time, mostly waiting on the host", ...]
    ov.kernels, ov.operators, ov.steps    # the tables (polyprof.analysis.table.Table)

The report (``polyprof report``) and ``polyprof summary --view`` show these same tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyprof.analysis import device as dev
from polyprof.analysis.operators import operator_table
from polyprof.analysis.status import backends_table, counter_series, counters_table
from polyprof.analysis.steps import step_breakdown
from polyprof.analysis.table import Table
from polyprof.model import Trace


@dataclass
class Overview:
    traces: list[Trace]
    ranks: list[int]
    steps: Table
    kernel_types: Table
    kernels: Table
    temporal: Table
    idle: Table
    launch: Table
    launch_samples: dict[str, np.ndarray]
    overlap: Table
    operators: Table
    backends: Table
    counters: Table
    counter_series: dict[str, tuple[np.ndarray, np.ndarray]]
    utilisation: tuple[np.ndarray, dict[str, np.ndarray]]
    rank_view: Any = None
    findings: list[str] = field(default_factory=list)


def _tagged(tables: list[Table], ranks: list[int]) -> Table:
    """Several ranks' tables as one, a rank column first (one trace: the table as it is)."""
    if len(tables) == 1:
        return tables[0]
    rows = [(r, *row) for r, t in zip(ranks, tables, strict=True) for row in t.rows]
    return Table(("rank", *tables[0].columns), rows, tables[0].title)


def overview(traces: Trace | Sequence[Trace], ranks: Sequence[int] | None = None, top: int = 50) -> Overview:
    items = [traces] if isinstance(traces, Trace) else list(traces)
    ranks = list(ranks) if ranks is not None else list(range(len(items)))
    works = [dev.DeviceWork(t) for t in items]
    per = lambda fn, **kw: _tagged([fn(t, work=w, **kw) for t, w in zip(items, works, strict=True)], ranks)  # noqa: E731
    launch = [dev.launch_latency(t, work=w) for t, w in zip(items, works, strict=True)]
    samples = {(f"rank {r} · {k}" if len(items) > 1 else k): v for r, (_, s) in zip(ranks, launch, strict=True) for k, v in s.items()}
    first = items[0]
    ov = Overview(
        traces=items, ranks=ranks,
        steps=step_breakdown(items, ranks, works),
        kernel_types=per(dev.kernel_types), kernels=per(dev.kernel_breakdown, top=top),
        temporal=per(dev.temporal_breakdown), idle=per(dev.idle_breakdown),
        launch=_tagged([t for t, _ in launch], ranks), launch_samples=samples, overlap=per(dev.overlap),
        operators=_tagged([operator_table(t, top=top) for t in items], ranks),
        backends=_tagged([backends_table(t) for t in items], ranks),
        counters=_tagged([counters_table(t) for t in items], ranks),
        counter_series=counter_series(first), utilisation=dev.utilisation(first, work=works[0]),
    )
    if len(items) > 1:
        from polyprof.analysis.ranks import rank_view

        ov.rank_view = rank_view(items)
    ov.findings = findings(ov)
    return ov


def _pct(share: float) -> str:
    """A share as a percentage, never rounded up to 100% (or down to 0%) when it is not."""
    if 0.995 <= share < 1 or 0 < share < 0.005:
        return f"{share:.1%}"
    return f"{share:.0%}"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms" if ns >= 1e5 else f"{ns / 1e3:.3g} us"


def findings(ov: Overview) -> list[str]:
    """The largest facts of the trace, worded for a person, most telling first."""
    out: list[str] = []
    steps = ov.steps.dicts()
    devices = sorted({s["device"] for s in steps if s["device"] != "host"})
    for d in devices:
        mine = [s for s in steps if s["device"] == d]
        span = sum(s["step_ns"] for s in mine) or 1
        idle = sum(s["idle_ns"] for s in mine) / span
        causes = [r for r in ov.idle.dicts() if r["device"] == d]
        by_cause: dict[str, int] = {}
        for r in causes:
            by_cause[r["cause"]] = by_cause.get(r["cause"], 0) + r["idle_ns"]
        why = ""
        if by_cause and sum(by_cause.values()):
            top = max(by_cause, key=lambda k: by_cause[k])
            why = {"host wait": ", mostly waiting on the host", "kernel wait": ", mostly in gaps between kernels",
                   "other": ", mostly waiting on something other than the host (syncs, other streams)"}[top]
        host_only = sum(s["host_only_ns"] for s in mine) / span
        if idle + host_only >= 0.2:
            split = f" ({_pct(host_only)} while the host runs code, {_pct(idle)} with neither busy)" if host_only >= 0.05 else ""
            out.append(f"{d} has nothing to do {_pct(idle + host_only)} of step time{split}{why}")
        comm = sum(s["communication_ns"] for s in mine) / span
        if comm >= 0.2:
            out.append(f"{d} spends {_pct(comm)} of step time in communication not hidden under computation")
    if not steps and ov.temporal.rows:
        for r in ov.temporal.dicts():
            if r["idle_share"] >= 0.2:
                out.append(f"{r['device']} idle {_pct(r['idle_share'])} of its busy span (no ProfilerStep# spans to compare with)")
    kernels = ov.kernels.dicts()
    for d in {k["device"] for k in kernels}:
        first = max((k for k in kernels if k["device"] == d), key=lambda k: k["total_ns"])
        if first["share"] >= 0.25:
            out.append(f"On {d}, {first['kernel']} takes {_pct(first['share'])} of device time ({first['calls']} calls, {_ms(first['total_ns'])})")
    ops = ov.operators.dicts()
    total_self = sum(o["self_ns"] for o in ops) or 1
    if ops:
        top_op = max(ops, key=lambda o: o["self_ns"])
        out.append(f"The largest host op by self time is {top_op['op']}: {_pct(top_op['self_ns'] / total_self)} of all ops' "
                   f"self time ({top_op['calls']} calls, {_ms(top_op['self_ns'])})")
    for r in ov.launch.dicts():
        if r["p99_ns"] >= 1e6:
            out.append(f"Launches on {r['device']} wait long: p99 {_ms(r['p99_ns'])} from launch call to start (worst {r['worst']})")
    for r in ov.overlap.dicts():
        if r["overlap_share"] < 0.5:
            out.append(f"Only {_pct(r['overlap_share'])} of the communication on {r['device']} overlaps computation")
    if ov.rank_view is not None and ov.rank_view.steps:
        slow = ov.rank_view.slowest_rank
        lag = [s.behind_ns for s in ov.rank_view.steps if s.slowest == slow]
        out.append(f"Rank {slow} is the slowest in {len(lag)} of {len(ov.rank_view.steps)} steps, by {_ms(float(np.median(lag)))} "
                   "(median, busy time above the ranks' median)")
    for b in ov.backends.dicts():
        if b["state"] == "failed" or b["errors"]:
            out.append(f"Backend {b['backend']} {b['state']}: {b['errors'] or b['reason']}")
        if b["dropped"] or b["rejected"]:
            rejected = f"{b['rejected']} rejected" if b["rejected"] else ""
            out.append(f"Backend {b['backend']} left rows out: " + ", ".join(x for x in (b["dropped"], rejected) if x))
    return out
