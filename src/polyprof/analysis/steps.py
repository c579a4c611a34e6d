"""Step time breakdown: each ``ProfilerStep#N`` split, per device, into computation, exposed
communication, exposed memory work and idle time.

::

    from polyprof.analysis.steps import step_breakdown
    table = step_breakdown(trace)          # or several ranks: step_breakdown([t0, t1], ranks=[0, 1])
    table.where(device="GPU 0")            # rank, step, device, step_ns, compute_ns, communication_ns, ...

Within a step, computation counts first, then communication not hidden under computation, then memory
work (copies, fills) not hidden under either, other device work, then *host-side only* (the device has
nothing to do while the step's thread runs host code: ops, annotations, runtime calls), and *idle* is
the rest of the step (neither runs: waiting, sleeping, Python between ops): together they add up to the
step's duration. A device row named ``host`` stands for a trace with no device work. A step is the
longest ``ProfilerStep#N`` span of that number (the same step on another thread's row counts once); its
thread is the one that span is on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from polyprof.analysis.intervals import clip, union_ns
from polyprof.analysis.table import Table
from polyprof.model import ActivityKind, Trace
from polyprof.model.steps import step_rows, steps_of
from polyprof.model.work import COMMUNICATION, COMPUTATION, DEVICE_ROW_KINDS, MEMORY, OTHER, DeviceWork

HOST = "host"
COLUMNS = ("rank", "step", "device", "step_ns", "compute_ns", "communication_ns", "memory_ns", "other_ns",
           "host_only_ns", "idle_ns")
HOST_WORK = (ActivityKind.CPU_OP, ActivityKind.USER_ANNOTATION, ActivityKind.RUNTIME, ActivityKind.DRIVER,
             ActivityKind.SYNC, ActivityKind.PYTHON_FUNCTION)


def step_breakdown(traces: Trace | Sequence[Trace], ranks: Sequence[int] | None = None,
                   works: Sequence[DeviceWork] | None = None) -> Table:
    """The breakdown of every step of every trace given (one per rank; `works`: their DeviceWork, when
    the caller has it already)."""
    items = [traces] if isinstance(traces, Trace) else list(traces)
    ranks = list(ranks) if ranks is not None else list(range(len(items)))
    works = list(works) if works is not None else [DeviceWork(t) for t in items]
    rows = []
    for rank, trace, work in zip(ranks, items, works, strict=True):
        devices = work.devices() or [None]
        acts = trace.activities
        host = np.isin(acts["kind"], [int(k) for k in HOST_WORK]) if len(acts) else np.zeros(0, bool)
        for step, row in step_rows(trace).items():
            lo, hi = int(acts["start"][row]), int(acts["end"][row])
            span = hi - lo
            mine = host & (acts["resource"] == acts["resource"][row])
            mine[row] = False
            host_busy = clip(acts["start"][mine], acts["end"][mine], lo, hi)
            for d in devices:
                taken = (np.zeros(0, np.int64), np.zeros(0, np.int64))
                parts = {}
                for kind in (COMPUTATION, COMMUNICATION, MEMORY, OTHER, HOST):
                    if kind == HOST:
                        s, e = host_busy
                    else:
                        m = work.on(d, kind) if d is not None else np.zeros(len(work.rows), bool)
                        s, e = clip(work.start[m], work.end[m], lo, hi)
                    both = (np.concatenate([taken[0], s]), np.concatenate([taken[1], e]))
                    parts[kind] = union_ns(*both) - union_ns(*taken)  # what this kind adds, not hidden
                    taken = both
                idle = span - sum(parts.values())
                rows.append((rank, step, work.heading(d) if d is not None else "host", span, parts[COMPUTATION],
                             parts[COMMUNICATION], parts[MEMORY], parts[OTHER], parts[HOST], idle))
    return Table.of(COLUMNS, rows, "Step time breakdown")


def select_steps(trace: Trace, steps: Iterable[int]) -> Trace:
    """The trace cut to the steps given: the rows that start within one of their spans, device rows
    counted where their launch call starts (their own start where no launch is known), so that a
    kernel runs in the step that launched it. ``select_steps(t, list(steps_of(t))[:-1])`` leaves the
    last step out, as Holistic Trace Analysis does when it reads a trace."""
    from polyprof.analysis.device import launch_starts

    spans = [span for n, span in steps_of(trace).items() if n in set(steps)]
    acts = trace.activities
    if not len(acts):
        return trace
    at = acts["start"].copy()
    device = np.flatnonzero(np.isin(acts["kind"], DEVICE_ROW_KINDS))
    launched = launch_starts(trace, device, acts["correlation"][device])
    at[device] = np.where(launched >= 0, launched, at[device])
    keep = np.zeros(len(acts), bool)
    for lo, hi in spans:
        keep |= (at >= lo) & (at < hi)
    return dataclasses.replace(trace, activities=acts.take(np.flatnonzero(keep)))
