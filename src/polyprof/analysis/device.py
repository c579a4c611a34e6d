"""Where device time went: kernel breakdown, temporal breakdown, idle time by cause, launch latency,
communication/computation overlap and utilisation over time.

::

    from polyprof.analysis import device
    device.kernel_types(trace)        # per device: COMPUTATION / COMMUNICATION / MEMORY / OTHER time
    device.kernel_breakdown(trace)    # per device: each kernel's calls, total, mean, share
    device.temporal_breakdown(trace)  # per device: span, idle, compute, non-compute (HTA's)
    device.idle_breakdown(trace)      # per device and stream: idle time waiting on host, kernels, other
    device.launch_latency(trace)      # per device: launch call start -> device start, p50 ... max
    device.overlap(trace)             # per device: communication time hidden under computation

Device work is every kernel, copy and fill (ActivityKind KERNEL, GPU_MEMCPY, GPU_MEMSET), on any
device. Kinds of work follow Holistic Trace Analysis (HTA 0.5) by name, so that the numbers agree with
it: communication is ``nccl...Kernel``; memory is ``Memcpy...``, ``Memset...``, ``dma...`` (and every
copy and fill, whatever its name: polyprof's backends say which rows are copies); other is what HTA
leaves out of computation (names with Memcpy/Memset inside, or ending in Sync...); computation is the
rest. Times are ns.
"""

from __future__ import annotations

import numpy as np

from polyprof.analysis.intervals import merge, overlap_ns, union_ns
from polyprof.analysis.table import Table
from polyprof.model import ActivityKind, Trace
from polyprof.model.work import COMMUNICATION, COMPUTATION, MEMORY, OTHER, DeviceWork

#: HTA's consecutive_kernel_delay: a gap shorter than this between kernels is launch overhead
KERNEL_WAIT_NS = 30_000


def kernel_types(trace: Trace, work: DeviceWork | None = None) -> Table:
    """Per device, HTA's kernel type breakdown: the time during which each kind of work runs alone, and
    each combination that runs at once (``COMPUTATION overlapping MEMORY``), with its share of the
    device's busy time; `count` is the number of rows of a single kind."""
    work = work or DeviceWork(trace)
    kinds = (COMPUTATION, COMMUNICATION, MEMORY, OTHER)
    rows = []
    for d in work.devices():
        times, steps = [], []
        counts = {}
        for bit, kind in enumerate(kinds):
            m = work.on(d, kind)
            counts[kind] = int(m.sum())
            if counts[kind]:
                s, e = merge(work.start[m], work.end[m])
                times += [s, e]
                steps += [np.full(len(s), 1 << bit), np.full(len(e), -(1 << bit))]
        t = np.concatenate(times)
        order = np.argsort(t, kind="stable")
        t, mask = t[order], np.cumsum(np.concatenate(steps)[order])
        seg = np.diff(t)
        by_mask = np.bincount(mask[:-1], weights=seg, minlength=16)
        busy = float(by_mask[1:].sum()) or 1.0
        for m in range(1, 16):
            if by_mask[m] > 0:
                label = " overlapping ".join(k for bit, k in enumerate(kinds) if m >> bit & 1)
                rows.append((work.heading(d), label, counts.get(label, 0), int(by_mask[m]), float(by_mask[m] / busy)))
    return Table.of(("device", "kind", "count", "total_ns", "share"), rows, "Device time by kind of work")


def kernel_breakdown(trace: Trace, top: int | None = None, work: DeviceWork | None = None) -> Table:
    """Per device, each kernel (copy, fill) by total time: calls, total, mean, min, max, its share of the
    device's busy time (the sum of its rows' durations), and its kind of work."""
    work = work or DeviceWork(trace)
    names = trace.activities.strings.strings
    rows = []
    for d in work.devices():
        on = np.flatnonzero(work.on(d))
        dur = (work.end[on] - work.start[on]).astype(np.int64)
        total = int(dur.sum()) or 1
        uniq, inverse = np.unique(work.name[on], return_inverse=True)
        sums = np.bincount(inverse, weights=dur).astype(np.int64)
        counts = np.bincount(inverse)
        mins = np.full(len(uniq), np.iinfo(np.int64).max)
        maxs = np.zeros(len(uniq), np.int64)
        np.minimum.at(mins, inverse, dur)
        np.maximum.at(maxs, inverse, dur)
        first = np.zeros(len(uniq), np.int64)
        first[inverse[::-1]] = on[::-1]
        order = np.argsort(-sums, kind="stable")[:top]
        for i in order.tolist():
            rows.append((work.heading(d), names[int(uniq[i])], work.type[int(first[i])], int(counts[i]), int(sums[i]),
                         float(sums[i] / counts[i]), int(mins[i]), int(maxs[i]), float(sums[i] / total)))
    return Table.of(("device", "kernel", "kind", "calls", "total_ns", "mean_ns", "min_ns", "max_ns", "share"),
                    rows, "Kernels, copies and fills by total time")


def temporal_breakdown(trace: Trace, work: DeviceWork | None = None) -> Table:
    """Per device, HTA's temporal breakdown: its span (first start to last end of device work), idle
    (the span less the union of its work), compute (the union of computation), non-compute (the rest)."""
    work = work or DeviceWork(trace)
    rows = []
    for d in work.devices():
        on = work.on(d)
        s, e = work.start[on], work.end[on]
        span = int(e.max() - s.min())
        busy = union_ns(s, e)
        comp = work.on(d, COMPUTATION)
        compute = union_ns(work.start[comp], work.end[comp])
        idle = span - busy
        rows.append((work.heading(d), span, idle, compute, busy - compute, idle / (span or 1), compute / (span or 1)))
    return Table.of(("device", "span_ns", "idle_ns", "compute_ns", "non_compute_ns", "idle_share", "compute_share"),
                    rows, "Temporal breakdown of device time")


def _launch_starts(trace: Trace, work: DeviceWork) -> np.ndarray:
    return launch_starts(trace, work.rows, work.correlation)


def launch_starts(trace: Trace, rows: np.ndarray, correlation: np.ndarray) -> np.ndarray:
    """For each of `rows` (device rows, with their `correlation` ids), the start of the host call that
    launched it (same correlation id, a runtime or driver row); -1 where none is known."""
    acts = trace.activities
    out = np.full(len(rows), -1, np.int64)
    if not len(acts) or not len(rows):
        return out
    kinds = acts["kind"]
    launch = np.flatnonzero(((kinds == int(ActivityKind.RUNTIME)) | (kinds == int(ActivityKind.DRIVER)))
                            & (acts["correlation"] != 0))
    if not len(launch):
        return out
    corr = acts["correlation"][launch]
    order = np.argsort(corr, kind="stable")
    corr, starts = corr[order], acts["start"][launch][order]
    at = np.clip(np.searchsorted(corr, correlation), 0, len(corr) - 1)
    found = (corr[at] == correlation) & (correlation != 0)
    out[found] = starts[at][found]
    return out


def idle_breakdown(trace: Trace, kernel_wait_ns: int = KERNEL_WAIT_NS, work: DeviceWork | None = None) -> Table:
    """Per device and stream (queue), HTA's idle time by cause: each gap between consecutive rows on a
    stream is *host wait* when the next row's launch call started after the previous row ended (the
    host was late), *kernel wait* when it is shorter than `kernel_wait_ns` (launch overhead), *other*
    otherwise (synchronisation, waiting on another stream)."""
    work = work or DeviceWork(trace)
    launched = _launch_starts(trace, work)
    resources = trace.resources
    rows = []
    for d in work.devices():
        for r in sorted(set(work.resource[work.on(d)].tolist())):
            idx = np.flatnonzero(work.on(d) & (work.resource == r))
            idx = idx[np.argsort(work.start[idx], kind="stable")]
            if len(idx) < 2:
                continue
            prev_end = work.end[idx][:-1]
            gap = work.start[idx][1:] - prev_end
            host = launched[idx][1:] > prev_end
            kernel = ~host & (gap < kernel_wait_ns)
            other = ~host & ~kernel
            total = int(gap.sum()) or 1
            stream = resources[r].name if 0 <= r < len(resources) else str(r)
            for cause, m in (("host wait", host), ("kernel wait", kernel), ("other", other)):
                t = int(gap[m].sum())
                rows.append((work.heading(d), stream, cause, int(m.sum()), t, t / total))
    return Table.of(("device", "stream", "cause", "gaps", "idle_ns", "share"), rows, "Device idle time by cause")


def launch_latency(trace: Trace, work: DeviceWork | None = None) -> tuple[Table, dict[str, np.ndarray]]:
    """Per device, the time from the start of each launch call to the start of its device work: count,
    mean, median, p90, p99, max and the worst row's name (the earliest of those that waited longest); and the latencies themselves per device (for
    a histogram)."""
    work = work or DeviceWork(trace)
    launched = _launch_starts(trace, work)
    names = trace.activities.strings.strings
    rows, samples = [], {}
    for d in work.devices():
        m = work.on(d) & (launched >= 0)
        if not m.any():
            continue
        lat = (work.start[m] - launched[m]).astype(np.int64)
        worst = int(np.lexsort((work.start[m], -lat))[0])  # the longest wait; of equal ones, the earliest
        heading = work.heading(d)
        samples[heading] = lat
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        rows.append((heading, len(lat), float(lat.mean()), float(p50), float(p90), float(p99), int(lat[worst]),
                     names[int(work.name[np.flatnonzero(m)[worst]])]))
    table = Table.of(("device", "launches", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "worst"),
                     rows, "Launch latency (launch call start to device start)")
    return table, samples


def overlap(trace: Trace, work: DeviceWork | None = None) -> Table:
    """Per device with communication, HTA's communication/computation overlap: the time both run at
    once, as a share of the communication time."""
    work = work or DeviceWork(trace)
    rows = []
    for d in work.devices():
        comm, comp = work.on(d, COMMUNICATION), work.on(d, COMPUTATION)
        if not comm.any():
            continue
        comm_ns = union_ns(work.start[comm], work.end[comm])
        both = overlap_ns((work.start[comm], work.end[comm]), (work.start[comp], work.end[comp]))
        rows.append((work.heading(d), comm_ns, both, both / (comm_ns or 1)))
    return Table.of(("device", "communication_ns", "overlapped_ns", "overlap_share"), rows,
                    "Communication hidden under computation")


def utilisation(trace: Trace, bins: int = 200, work: DeviceWork | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The busy share of each device in `bins` equal slices of the trace's device span: (bin starts in
    ns, {device: shares})."""
    work = work or DeviceWork(trace)
    if not len(work.rows):
        return np.zeros(0, np.int64), {}
    lo, hi = int(work.start.min()), int(work.end.max())
    edges = np.linspace(lo, hi, bins + 1).astype(np.int64)
    width = max((hi - lo) / bins, 1.0)
    out = {}
    for d in work.devices():
        s, e = merge(work.start[work.on(d)], work.end[work.on(d)])
        # covered time before each edge, from the cumulative busy time of the merged intervals
        cum = np.concatenate([[0], np.cumsum(e - s)])
        i = np.searchsorted(e, edges, side="left")
        inside = np.clip(edges - s[np.minimum(i, len(s) - 1)], 0, None) * (i < len(s))
        before = cum[i] + np.minimum(inside, (e - s)[np.minimum(i, len(s) - 1)])
        out[work.heading(d)] = np.diff(before) / width
    return edges[:-1], out
