"""The operator table: host ops with their self and total host time, calls, and the device time of the
work they launched (through ``External id``), grouped by name or by name and input shapes.

::

    from polyprof.analysis.operators import operator_table
    table = operator_table(trace)                 # op, calls, total_ns, self_ns, device_ns, device_total_ns
    operator_table(trace, by_shape=True)          # one row per (op, Input Dims) where shapes were recorded

An op is a framework operator (``cpu_op``) or a user annotation (``record_function``), steps
(``ProfilerStep#N``) aside. *Self* host time is its time less the host rows nested in it on the same
thread (ops, annotations, runtime calls), as torch.profiler's ``self_cpu_time_total``; as in
torch.profiler's tables, an op whose only child is an op of the same name counts once. *Device* time is
the time of the device rows whose External id is the op's (what it launched itself); *device total*
adds what the ops nested in it launched, as torch.profiler's device totals do.
"""

from __future__ import annotations

import numpy as np

from polyprof.analysis.table import Table
from polyprof.model import ActivityKind, Trace
from polyprof.model.steps import step_number
from polyprof.model.work import DEVICE_ROW_KINDS

OP_KINDS = (int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION))
HOST_KINDS = (*OP_KINDS, int(ActivityKind.RUNTIME), int(ActivityKind.DRIVER), int(ActivityKind.SYNC),
              int(ActivityKind.PYTHON_FUNCTION), int(ActivityKind.OVERHEAD))
COLUMNS = ("op", "input_dims", "calls", "total_ns", "self_ns", "mean_ns", "device_ns", "device_total_ns")


def _nesting(acts, rows: np.ndarray, device_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For host rows `rows` (one thread, sorted): self time, inclusive device time, and the row each is
    directly nested in (-1: none)."""
    order = rows[np.lexsort((-acts["end"][rows], acts["start"][rows]))]
    start, end = acts["start"][order].tolist(), acts["end"][order].tolist()
    own = device_of[order].tolist()
    child = [0] * len(order)
    parent = [-1] * len(order)
    dev_total = list(own)
    stack: list[int] = []
    for i in range(len(order)):
        while stack and start[i] >= end[stack[-1]]:
            done = stack.pop()
            if stack:
                dev_total[stack[-1]] += dev_total[done]
        if stack:
            child[stack[-1]] += end[i] - start[i]
            parent[i] = stack[-1]
        stack.append(i)
    while stack:
        done = stack.pop()
        if stack:
            dev_total[stack[-1]] += dev_total[done]
    self_ns = np.asarray(end, np.int64) - np.asarray(start, np.int64) - np.asarray(child, np.int64)
    parent_row = np.array([order[p] if p >= 0 else -1 for p in parent], np.int64)
    back = np.argsort(order)  # the place in `order` of each of sorted(rows)
    return self_ns[back], np.asarray(dev_total, np.int64)[back], parent_row[back]


def operator_table(trace: Trace, by_shape: bool = False, top: int | None = None) -> Table:
    acts = trace.activities
    if not len(acts):
        return Table.of(COLUMNS, [], "Operators")
    kinds = acts["kind"]
    names = acts.strings.strings
    step_codes = [c for c, n in enumerate(names) if step_number(n) is not None]
    host = np.flatnonzero(np.isin(kinds, HOST_KINDS) & ~np.isin(acts["name"], step_codes))
    # device time by External id, then per host row
    dev = np.flatnonzero(np.isin(kinds, DEVICE_ROW_KINDS) & (acts["external_id"] != 0))
    by_ext: dict[int, int] = {}
    if len(dev):
        ext, inverse = np.unique(acts["external_id"][dev], return_inverse=True)
        sums = np.bincount(inverse, weights=(acts["end"][dev] - acts["start"][dev]))
        by_ext = dict(zip(ext.tolist(), sums.astype(np.int64).tolist(), strict=True))
    ext_host = acts["external_id"][host].tolist()
    is_op = np.isin(kinds[host], OP_KINDS)
    own_device = np.array([by_ext.get(e, 0) if e and op else 0 for e, op in zip(ext_host, is_op.tolist(), strict=True)],
                          dtype=np.int64)
    device_of = np.zeros(len(acts), np.int64)
    device_of[host] = own_device
    self_ns = np.zeros(len(acts), np.int64)
    dev_total = np.zeros(len(acts), np.int64)
    parent = np.full(len(acts), -1, np.int64)
    resource = acts["resource"][host]
    for r in np.unique(resource).tolist():
        rows = np.sort(host[resource == r])
        self_ns[rows], dev_total[rows], parent[rows] = _nesting(acts, rows, device_of)
    ops = host[is_op]
    # an op whose only child is an op of its own name (aten::sum calling aten::sum) is one op, as
    # torch.profiler's tables count it: the child folds into it
    children = np.bincount(parent[host][parent[host] >= 0], minlength=len(acts))
    fold = [i for i in ops.tolist() if parent[i] >= 0 and children[parent[i]] == 1 and acts["name"][i] == acts["name"][parent[i]]]
    for i in sorted(fold, key=lambda i: -int(acts["start"][i])):  # innermost first: chains fold up
        p = int(parent[i])
        self_ns[p] += self_ns[i]
        device_of[p] += device_of[i]
    ops = np.setdiff1d(ops, np.asarray(fold, np.int64))
    shapes = [""] * len(ops)
    if by_shape:
        shapes = [str(acts.args.get(int(i), {}).get("Input Dims", "")) for i in ops.tolist()]
    groups: dict[tuple[int, str], list[int]] = {}
    for i, shape in zip(ops.tolist(), shapes, strict=True):
        groups.setdefault((int(acts["name"][i]), shape), []).append(i)
    rows = []
    for (code, shape), members in groups.items():
        m = np.asarray(members)
        total = int((acts["end"][m] - acts["start"][m]).sum())
        rows.append((names[code], shape, len(m), total, int(self_ns[m].sum()), total / len(m),
                     int(device_of[m].sum()), int(dev_total[m].sum())))
    rows.sort(key=lambda r: (-r[3], r[0]))
    return Table.of(COLUMNS, rows[:top] if top else rows, "Operators")
