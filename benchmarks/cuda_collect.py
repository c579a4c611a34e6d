"""polyprof-cuda collect throughput: decoded CUPTI records -> activities, without a GPU.

    .venv/bin/python benchmarks/cuda_collect.py [--kernels 300000]

Feeds the session's collect with the tuples its buffer callback produces (a launch, an external
correlation and a kernel per launch, plus copies) and reports records processed per second. Needs
cupti-python installed (for its enums), not a GPU. Target (issue #5): >= 1 M records/s at collect.
Also reports how long merging the rows into a trace and writing it as Chrome JSON takes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import report

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "plugins", "polyprof-cuda", "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", type=int, default=300_000)
    args = ap.parse_args()
    from polyprof_cuda.records import EXTERNAL, KERNEL, MEMCPY, RUNTIME, Api, External, Kernel, Memcpy
    from polyprof_cuda.session import CudaSession
    from recorded_cupti import RecordedLayer

    from polyprof.backend import ProfileConfig, SessionContext, Sink
    from polyprof.clock import host_ns

    layer = RecordedLayer()
    ctx = SessionContext("cuda")
    session = CudaSession(layer, layer.devices(), ProfileConfig(), ctx)
    session.pairs = [(layer.timestamp(), host_ns(), 100)]
    t0 = layer.timestamp()
    n = args.kernels
    tid = os.getpid()
    session.raw[RUNTIME] = [Api(211, t0 + i * 1000, t0 + i * 1000 + 300, tid, i + 1) for i in range(n)]
    session.raw[EXTERNAL] = [External(3, 7, i + 1) for i in range(n)]
    session.raw[KERNEL] = [
        Kernel(
            f"kernel_{i % 50}",
            t0 + i * 1000 + 500,
            t0 + i * 1000 + 900,
            0,
            i % 2,
            1,
            7 + i % 4,
            i + 1,
            32,
            1024,
            (64, 1, 1),
            (128, 1, 1),
            0,
            0,
            0,
            0,
        )
        for i in range(n)
    ]
    copies = n // 10
    session.raw[MEMCPY] = [
        Memcpy(1, 1, 3, 1 << 20, t0 + i * 1000 + 600, t0 + i * 1000 + 800, 0, 1, 7, n + i + 1, 0, 0)
        for i in range(copies)
    ]
    records = 3 * n + copies
    from polyprof.engine.lifecycle import gc_paused

    sink = Sink("cuda")
    start = time.perf_counter()
    with gc_paused():  # as the engine runs every collect
        session.collect(sink)
    seconds = time.perf_counter() - start
    export_seconds, events = _merge_and_export(sink)
    report(
        "cuda_collect",
        {
            "records": records,
            "activities": len(sink.builder),
            "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds),
            "target_records_per_s": 1_000_000,
            "meets_target": records / seconds >= 1_000_000,
            "merge_and_export_seconds": round(export_seconds, 3),
            "trace_events_per_s_merge_and_export": round(events / export_seconds),
        },
    )


def _merge_and_export(sink) -> tuple[float, int]:
    """What follows collect when a profile stops: merge into a trace, write it as Chrome JSON."""
    import tempfile

    from polyprof.clock import base_time_ns, epoch_offset
    from polyprof.engine.merge import CollectedPart, merge
    from polyprof.export import write_chrome_trace
    from polyprof.model import BackendStatus

    rows = sink.builder.freeze()
    window = (int(rows["start"].min()), int(rows["end"].max()))
    offset = epoch_offset().offset_ns
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        trace = merge(
            [CollectedPart(BackendStatus("cuda"), sink)],
            window=window,
            epoch_offset_ns=offset,
            base_time_ns=base_time_ns(window[0] + offset),
            metadata={},
        )
        write_chrome_trace(trace, os.path.join(folder, "cuda.json"))
        seconds = time.perf_counter() - start
    events = len(trace.activities) + int((trace.activities["flow_id"] != 0).sum())
    return seconds, events


if __name__ == "__main__":
    main()
