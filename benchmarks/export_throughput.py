"""Chrome-trace export throughput: 1,000,000 synthetic activities to .json and .json.gz, and
torch.profiler's export_chrome_trace on a trace of similar size, in the same run.

    .venv/bin/python benchmarks/export_throughput.py [--activities 1000000] [--torch-ops 300000]

The synthetic trace has mixed kinds (runtime calls, kernels, copies, fills, ops, annotations), five
devices (the host and four simulated GPUs, two streams each), an ac2g flow from every launch to its
device work, and args on a tenth of the rows. Throughput counts trace events written (activities,
flow ends, metadata rows) per second of export wall time. Target (issue #2): at least 3x torch's.

The same trace is also written as Perfetto protobuf (.pftrace, issue #15); its throughput counts the
same events as the JSON of that trace, so the ratio is the ratio of wall times. Targets: at least 2x the
JSON writer's events/s, at most 1/3 of the JSON bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
from _common import report

from polyprof.formats import write_chrome_trace, write_perfetto_trace
from polyprof.merge import merge
from polyprof.model import FLOW_AC2G, ActivityKind, BackendStatus, Trace
from polyprof.plugin.clock import base_time_ns, epoch_offset, host_ns
from polyprof.plugin.sink import Sink


def synthetic_trace(n: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    sink = Sink("synthetic")
    host = sink.host_device()
    threads = [sink.host_thread(1000 + i, f"worker {i}") for i in range(4)]
    streams = []
    for d in range(4):
        dev = sink.device(f"gpu:{d}", type="gpu", index=d, name=f"GPU {d}", properties={"memory": 80 << 30})
        streams += [(dev, sink.resource(dev, 7 + s, f"stream {7 + s}")) for s in range(2)]
    t0 = host_ns()
    pairs = n // 3  # a launch on the host and its device work
    singles = n - 2 * pairs  # host ops and annotations
    start = t0 + np.sort(rng.integers(0, 10_000_000_000, n))
    dur = rng.integers(500, 50_000, n)
    kind = np.empty(n, dtype=np.int64)
    device = np.empty(n, dtype=np.int64)
    resource = np.empty(n, dtype=np.int64)
    flow = np.zeros(n, dtype=np.int64)
    flow_start = np.zeros(n, dtype=np.int64)
    corr = np.zeros(n, dtype=np.int64)
    idx = rng.permutation(n)
    launch, work, host_only = idx[:pairs], idx[pairs : 2 * pairs], idx[2 * pairs :]
    launch, work = np.sort(launch), np.sort(work)
    # make every device row start after its launch
    lo, hi = np.minimum(launch, work), np.maximum(launch, work)
    launch, work = lo, hi
    kind[launch] = int(ActivityKind.RUNTIME)
    device[launch] = host
    resource[launch] = np.asarray(threads)[rng.integers(0, 4, pairs)]
    work_kinds = np.array(
        [int(ActivityKind.KERNEL)] * 6 + [int(ActivityKind.GPU_MEMCPY)] * 3 + [int(ActivityKind.GPU_MEMSET)]
    )
    kind[work] = work_kinds[rng.integers(0, len(work_kinds), pairs)]
    choice = rng.integers(0, len(streams), pairs)
    device[work] = np.array([s[0] for s in streams])[choice]
    resource[work] = np.array([s[1] for s in streams])[choice]
    ids = np.arange(1, pairs + 1)
    flow[launch], flow[work] = ids, ids
    corr[launch], corr[work] = ids, ids
    flow_start[launch] = 1
    kind[host_only] = np.where(
        rng.random(singles) < 0.8, int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION)
    )
    device[host_only] = host
    resource[host_only] = np.asarray(threads)[rng.integers(0, 4, singles)]
    names_by_kind = {
        int(ActivityKind.RUNTIME): ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync"],
        int(ActivityKind.KERNEL): [f"void gemm_kernel<{i}>(float const*, float*)" for i in range(50)],
        int(ActivityKind.GPU_MEMCPY): ["Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)"],
        int(ActivityKind.GPU_MEMSET): ["Memset (Device)"],
        int(ActivityKind.CPU_OP): [f"aten::op_{i}" for i in range(200)],
        int(ActivityKind.USER_ANNOTATION): [f"step {i}" for i in range(20)],
    }
    pick = rng.integers(0, 1 << 30, n)
    names = [
        names_by_kind[k][p % len(names_by_kind[k])] for k, p in zip(kind.tolist(), pick.tolist(), strict=True)
    ]
    cats = {int(ActivityKind.RUNTIME): "cuda_runtime"}
    args = {
        int(i): {"grid": [128, 1, 1], "block": [256, 1, 1], "stream": 7}
        for i in np.flatnonzero(rng.random(n) < 0.1)
    }
    kept = sink.activities(
        {
            "kind": kind,
            "name": names,
            "cat": [cats.get(k) or ActivityKind(k).name.lower() for k in kind.tolist()],
            "device": device,
            "resource": resource,
            "start": start,
            "end": start + dur,
            "correlation": corr,
            "external_id": np.where(kind == int(ActivityKind.CPU_OP), np.arange(n), 0),
            "flow_id": flow,
            "flow_type": np.where(flow != 0, FLOW_AC2G, 0),
            "flow_start": flow_start,
        },
        args,
    )
    assert kept == n, f"synthetic rows rejected: {sink.rejected}"
    epoch = epoch_offset()
    return merge(
        [sink.seal(BackendStatus("synthetic"))],
        window=(int(start.min()), int((start + dur).max())),
        epoch_offset_ns=epoch.offset_ns,
        base_time_ns=base_time_ns(t0 + epoch.offset_ns),
        metadata={},
    )


def count_events(path: str) -> int:
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return len(json.loads(f.read())["traceEvents"])


def remove_previous(path: str) -> None:
    """Delete the previous run's file before a timed write: replacing it would time the file system
    freeing it (~70 ms for the JSON's 210 MB here), which is not the writer's cost (see also
    _common.scratch_folder)."""
    if os.path.exists(path):
        os.remove(path)


def median_seconds(fn, repeats: int, path: str) -> float:
    """The median time of `repeats` calls of `fn`, which writes `path` (each after remove_previous)."""
    samples = []
    for _ in range(repeats):
        remove_previous(path)
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def time_export(trace: Trace, path: str, repeats: int) -> dict:
    seconds = median_seconds(lambda: write_chrome_trace(trace, path), repeats, path)
    events = count_events(path)
    size = os.path.getsize(path)
    return {
        "seconds": round(seconds, 3),
        "events": events,
        "events_per_s": round(events / seconds),
        "activities_per_s": round(len(trace.activities) / seconds),
        "bytes_per_event": round(size / events, 1),
    }


def time_perfetto_export(trace: Trace, path: str, repeats: int, json_result: dict, json_path: str) -> dict:
    seconds = median_seconds(lambda: write_perfetto_trace(trace, path), repeats, path)
    events = json_result["events"]  # the same trace: the events the JSON of it holds
    size = os.path.getsize(path)
    return {
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "bytes": size,
        "bytes_ratio_to_json": round(size / os.path.getsize(json_path), 3),
        "ratio_events_per_s_over_json": round(json_result["seconds"] / seconds, 2),
    }


def torch_export(n_ops: int, folder: str, repeats: int) -> dict:
    """torch can save a trace once, so each repeat profiles the same loop again and exports it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.ones(4)
    path = os.path.join(folder, "torch.json")
    samples = []
    for _ in range(repeats):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(n_ops):
                torch.add(a, a)
        remove_previous(path)
        t0 = time.perf_counter()
        prof.export_chrome_trace(path)
        samples.append(time.perf_counter() - t0)
    seconds = statistics.median(samples)
    events = count_events(path)
    return {
        "version": torch.__version__,
        "seconds": round(seconds, 3),
        "events": events,
        "events_per_s": round(events / seconds),
        "bytes_per_event": round(os.path.getsize(path) / events, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--activities", type=int, default=1_000_000)
    ap.add_argument("--torch-ops", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=5, help="exports timed per format; medians are reported")
    args = ap.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        trace = synthetic_trace(args.activities)
        results["build_seconds"] = round(time.perf_counter() - t0, 2)
        results["activities"] = len(trace.activities)
        results["repeats"] = args.repeats
        results["json"] = time_export(trace, os.path.join(folder, "t.json"), args.repeats)
        results["json_gz"] = time_export(trace, os.path.join(folder, "t.json.gz"), args.repeats)
        json_path = os.path.join(folder, "t.json")
        write_chrome_trace(trace, json_path)
        results["perfetto"] = time_perfetto_export(
            trace, os.path.join(folder, "t.pftrace"), args.repeats, results["json"], json_path
        )
        results["perfetto_targets"] = {"events_per_s_over_json_min": 2.0, "bytes_ratio_max": 0.333}
        results["perfetto_meets_targets"] = (
            results["perfetto"]["ratio_events_per_s_over_json"] >= 2.0 and results["perfetto"]["bytes_ratio_to_json"] <= 0.333
        )
        try:
            results["torch"] = torch_export(args.torch_ops, folder, args.repeats)
        except ImportError:
            results["torch"] = "not installed"
        else:
            ratio = results["json"]["events_per_s"] / results["torch"]["events_per_s"]
            results["ratio_json_events_per_s_over_torch"] = round(ratio, 2)
            results["ratio_gz_events_per_s_over_torch"] = round(
                results["json_gz"]["events_per_s"] / results["torch"]["events_per_s"], 2
            )
            results["target_ratio"] = 3.0
            results["meets_target"] = ratio >= 3.0
    report("export_throughput", results)


if __name__ == "__main__":
    main()
