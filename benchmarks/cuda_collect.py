"""polyprof-cuda collect throughput: raw CUPTI buffers -> activities, without a GPU.

    .venv/bin/python benchmarks/cuda_collect.py [--kernels 300000]

Fills the session's own 8 MB buffers as CUPTI does (the records' C structs back to back: a launch, an
external correlation and a kernel per launch, plus copies), then times stop and collect: the walk,
decoding (done at stop, while CUPTI is certainly alive) and the mapping to activities; reports records
per second. Also times the buffer-completed callback
(what runs on CUPTI's thread while the program runs) and merging + writing Chrome JSON. Needs
cupti-python installed (its record classes and layouts), not a GPU; the records are built here, so
their kernel names are not shared strings as CUPTI's are (each distinct name pointer is read once:
here one per record, a worst case). Target (issue #5): >= 1 M records/s at collect.
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
    ap.add_argument("--kernels", type=int, default=200_000)
    args = ap.parse_args()
    from cupti import cupti
    from polyprof_cuda.raw_buffers import BufferPool
    from polyprof_cuda.session import CudaSession
    from recorded_cupti import RecordedLayer, kernel_record, latest_class, make_record

    from polyprof.plugin.backend import ProfileConfig, SessionContext
    from polyprof.plugin.clock import ClockPair, host_ns
    from polyprof.plugin.sink import Sink

    layer = RecordedLayer()
    ctx = SessionContext("cuda")
    session = CudaSession(layer, layer.devices(), ProfileConfig(), ctx)
    session.pairs.add(ClockPair(layer.timestamp(), host_ns(), 100))
    t0 = layer.timestamp()
    n = args.kernels
    tid = os.getpid()
    kind = cupti.ActivityKind
    memcpy_layout = latest_class("ActivityMemcpy")
    buffer: list = []
    for i in range(n):
        at = t0 + i * 1000
        buffer.append(
            make_record(
                "ActivityAPI",
                kind=int(kind.RUNTIME),
                cbid=211,
                start=at,
                end=at + 300,
                thread_id=tid,
                correlation_id=i + 1,
            )
        )
        buffer.append(
            make_record(
                "ActivityExternalCorrelation",
                kind=int(kind.EXTERNAL_CORRELATION),
                external_kind=int(cupti.ExternalCorrelationKind.CUSTOM1),
                external_id=7,
                correlation_id=i + 1,
            )
        )
        buffer.append(
            kernel_record(f"kernel_{i % 50}", at + 500, at + 900, i + 1, device_id=i % 2, stream_id=7 + i % 4)
        )
    copies = n // 10
    for i in range(copies):
        at = t0 + i * 1000
        buffer.append(
            make_record(
                memcpy_layout,
                kind=int(kind.MEMCPY),
                copy_kind=1,
                src_kind=1,
                dst_kind=3,
                bytes=1 << 20,
                start=at + 600,
                end=at + 800,
                device_id=0,
                context_id=1,
                stream_id=7,
                correlation_id=n + i + 1,
            )
        )
    # "CUPTI" fills the session's buffers (not timed: that is CUPTI's work)
    layer.c.raw.register_buffer_callbacks(session.pool.requested, session.pool.completed)
    layer.c.raw.deliver(buffer)
    buffers = layer.c.raw.delivered_buffers
    del buffer
    # the buffer-completed callback, on CUPTI's thread while the program runs (holding the GIL)
    spare = BufferPool(session.buffer_bytes, max_bytes=1 << 40)
    start = time.perf_counter()
    for _ in range(1000):
        spare.completed(spare.requested()[0], 1 << 20)
    callback_us = (time.perf_counter() - start) / 1000 * 1e6
    del spare
    records = 3 * n + copies
    from polyprof.engine.sessions import gc_paused

    sink = Sink("cuda")
    session.tracing = True  # as after prepare: stop() flushes (nothing left here) and decodes
    start = time.perf_counter()
    with gc_paused():  # as the engine runs every stop and collect
        session.stop()
        session.collect(sink)
    seconds = time.perf_counter() - start
    from polyprof.model import BackendStatus

    part = sink.seal(BackendStatus("cuda"))
    export_seconds, events = _merge_and_export(part)
    report(
        "cuda_collect",
        {
            "records": records,
            "buffers": buffers,
            "buffer_request_and_complete_us": round(callback_us, 2),
            "activities": len(part.activities),
            "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds),
            "target_records_per_s": 1_000_000,
            "meets_target": records / seconds >= 1_000_000,
            "merge_and_export_seconds": round(export_seconds, 3),
            "trace_events_per_s_merge_and_export": round(events / export_seconds),
        },
    )


def _merge_and_export(part) -> tuple[float, int]:
    """What follows collect when a profile stops: merge into a trace, write it as Chrome JSON."""
    import tempfile

    from polyprof.formats import write_chrome_trace
    from polyprof.merge import merge
    from polyprof.plugin.clock import base_time_ns, epoch_offset
    rows = part.activities
    window = (int(rows["start"].min()), int(rows["end"].max()))
    offset = epoch_offset().offset_ns
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        trace = merge(
            [part],
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
