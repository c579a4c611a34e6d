"""Stop to trace at scale: 1 M annotations on 4 threads plus 1 M device rows, and torch.profiler's stop +
export of a CPU profile in the same run.

    .venv/bin/python benchmarks/stop_to_trace.py [--annotations 1000000] [--device-rows 1000000]
                                                 [--torch-annotations 100000] [--repeats 3]

The workload: 4 threads each open `annotations / 4` ``polyprof.record_function`` spans; inside every
other one the thread notes a launch time. A test backend (group BENCH) turns those into
`device_rows / 2` runtime launches on the launching threads, each with an ac2g flow to a kernel on one
of three devices (two streams each), and hands them over as columns at collect, as a vendor backend
does. Reported (medians over the repeats):

- ``stop_ms``: the call that ends the window (``prof.stop()``) — the time the training thread is
  blocked;
- ``merge_ms`` / ``write_ms``: merge and Chrome-JSON write, wherever they ran;
- ``stop_to_written_ms``: from the call that ends the window until the file is complete;
- ``merge_rows_per_s``: rows merged per second of merge time;
- ``events_per_s``: trace events written (activities, flow ends, metadata) per second of stop to
  trace written, against torch.profiler's ``__exit__`` + ``export_chrome_trace`` of
  ``record_function`` spans on one thread (its events/s measured the same way).

``training_loop``: the same window ended by a schedule's ``step()`` with an ``on_trace_ready`` handler
that writes the file; the loop goes on with GIL-bound Python steps (a GPU training loop's host side)
while the writer merges and writes, and their mean time is compared with the same steps afterwards.

Targets (issue #13): merge at least 5 M rows/s; events/s at least 5x torch.profiler's; the call that
ends the window within 50 ms; steps while the writer works at most 10% slower.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import threading
import time

import numpy as np
from _common import report, scratch_folder

import polyprof
from polyprof.model import FLOW_AC2G, ActivityKind
from polyprof.plugin.backend import API_VERSION, Availability

THREADS = 4
DEVICES = 3
STREAMS = 2


class _LaunchLog:
    """Per thread: native tid and the launch times noted inside annotations."""

    def __init__(self) -> None:
        self.by_thread: dict[int, np.ndarray] = {}
        self.lock = threading.Lock()


class BenchSession:
    def __init__(self, log: _LaunchLog, device_rows: int) -> None:
        self.log = log
        self.pairs = device_rows // 2

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def collect(self, sink) -> None:
        host = sink.host_device()
        threads = {tid: sink.host_thread(tid) for tid in self.log.by_thread}
        streams = []
        for d in range(DEVICES):
            dev = sink.device(f"bench:{d}", type="gpu", index=d, name=f"Bench GPU {d}")
            streams += [(dev, sink.resource(dev, 7 + s, f"stream {7 + s}")) for s in range(STREAMS)]
        launch_ts = np.concatenate(list(self.log.by_thread.values()))[: self.pairs]
        launch_res = np.concatenate(
            [np.full(len(v), threads[tid]) for tid, v in self.log.by_thread.items()]
        )[: self.pairs]
        n = len(launch_ts)
        corr = np.arange(1, n + 1, dtype=np.int64) + 10_000_000_000
        choice = np.arange(n) % len(streams)
        stream_dev = np.array([s[0] for s in streams])[choice]
        stream_res = np.array([s[1] for s in streams])[choice]
        kind = np.concatenate([np.full(n, int(ActivityKind.RUNTIME)), np.full(n, int(ActivityKind.KERNEL))])
        start = np.concatenate([launch_ts, launch_ts + 5_000])
        end = np.concatenate([launch_ts + 2_000, launch_ts + 9_000])
        kernel_names = [f"void bench_kernel<{i}>(float*)" for i in range(32)]
        from polyprof.model import CodedStrings

        names = CodedStrings(
            np.concatenate([np.zeros(n, np.int64), 1 + (np.arange(n) % 32)]),
            ["cudaLaunchKernel", *kernel_names],
        )
        sink.activities(
            {
                "kind": kind,
                "name": names,
                "device": np.concatenate([np.full(n, host), stream_dev]),
                "resource": np.concatenate([launch_res, stream_res]),
                "start": start,
                "end": end,
                "correlation": np.concatenate([corr, corr]),
                "flow_id": np.concatenate([corr, corr]),
                "flow_type": np.full(2 * n, FLOW_AC2G),
                "flow_start": np.concatenate([np.ones(n, np.int8), np.zeros(n, np.int8)]),
            }
        )

    def close(self) -> None:
        pass


class BenchBackend:
    name = "bench"
    api_version = API_VERSION
    activities = frozenset({"BENCH"})

    def __init__(self) -> None:
        self.log = _LaunchLog()
        self.device_rows = 0

    def probe(self) -> Availability:
        return Availability.yes()

    def create_session(self, config, ctx) -> BenchSession:
        return BenchSession(self.log, self.device_rows)


def _annotate(count: int, launches: _LaunchLog) -> None:
    times = np.empty(count // 2 + 1, dtype=np.int64)
    rf = polyprof.record_function
    clock = time.perf_counter_ns
    j = 0
    for i in range(count):
        with rf("bench op"):
            if i & 1 == 0:
                times[j] = clock()
                j += 1
    with launches.lock:
        launches.by_thread[threading.get_native_id()] = times[:j]


def run_polyprof(backend: BenchBackend, annotations: int, folder: str) -> dict[str, float]:
    """One window of `annotations` spans and the backend's device rows; its stop, merge and write."""
    backend.log.by_thread.clear()
    prof = polyprof.profile(activities=["cpu", "bench"])
    prof.start()
    workers = [
        threading.Thread(target=_annotate, args=(annotations // THREADS, backend.log)) for _ in range(THREADS)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    path = os.path.join(folder, "polyprof.json")
    background = "wait" in inspect.signature(prof.stop).parameters
    t0 = time.perf_counter_ns()
    if background:
        prof.stop(wait=False)  # the training thread's part only; merge and write run on the writer
    else:
        prof.stop()  # before issue #13: stop merged on the calling thread
    t1 = time.perf_counter_ns()
    prof.export_chrome_trace(path)  # waits for the trace where the merge runs in the background
    t2 = time.perf_counter_ns()
    trace = prof.trace
    timings = getattr(trace, "timings_ms", None) or trace.metadata["polyprof"].get("postprocess_ms", {})
    rows = len(trace.activities)
    handed_over = sum(st.activities for st in trace.backends.values())
    flows = int(np.count_nonzero(trace.activities["flow_id"]))
    events = rows + flows + 2 * len(trace.devices) * 2 + 2 * len(trace.resources)
    merge_ms = float(timings.get("merge", float("nan")))
    write_ms = float(timings.get("write", float("nan")))
    os.unlink(path)
    return {
        "stop_ms": (t1 - t0) / 1e6,
        "export_call_ms": (t2 - t1) / 1e6,
        "stop_to_written_ms": (t2 - t0) / 1e6,
        "merge_ms": merge_ms,
        "write_ms": write_ms,
        "backend_rows": handed_over,
        "trace_rows": rows,
        "events": events,
        # rows the backends handed over, merged per second (the trace adds device-side annotation spans)
        "merge_rows_per_s": handed_over / (merge_ms / 1e3) if merge_ms == merge_ms else float("nan"),
        "events_per_s": events / ((t2 - t0) / 1e9),
    }


def python_step(n: int = 100_000) -> int:
    """A training step's host side as it looks on a GPU machine: Python-level work that holds the GIL
    (the kernels run elsewhere)."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def step_times_during_background(backend: BenchBackend, annotations: int, folder: str) -> dict[str, float]:
    """The window ends at a step() of a schedule; the handler writes the trace. Step times of the
    training loop while the writer merges and writes, against the same steps with nothing in the
    background."""
    import statistics

    backend.log.by_thread.clear()
    path = os.path.join(folder, "step.json")
    done = threading.Event()

    def handler(prof) -> None:
        prof.export_chrome_trace(path)
        done.set()

    sched = polyprof.schedule(wait=0, warmup=1, active=1, repeat=1)
    prof = polyprof.profile(activities=["cpu", "bench"], schedule=sched, on_trace_ready=handler)
    prof.start()
    prof.step()  # warm-up step 0 -> recording
    workers = [threading.Thread(target=_annotate, args=(annotations // THREADS, backend.log)) for _ in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    t0 = time.perf_counter_ns()
    prof.step()  # ends the window: the training thread's part only
    window_end_ms = (time.perf_counter_ns() - t0) / 1e6
    during = []
    while not done.is_set():
        s0 = time.perf_counter_ns()
        python_step()
        during.append((time.perf_counter_ns() - s0) / 1e6)
    prof.stop()
    idle = []
    for _ in range(max(20, len(during))):
        s0 = time.perf_counter_ns()
        python_step()
        idle.append((time.perf_counter_ns() - s0) / 1e6)
    os.unlink(path)
    slower = statistics.mean(during) / statistics.mean(idle) - 1 if during else 0.0
    return {
        "window_end_step_ms": window_end_ms,
        "steps_during_background": len(during),
        "step_ms_idle_mean": statistics.mean(idle),
        "step_ms_during_mean": statistics.mean(during) if during else float("nan"),
        "step_ms_during_max": max(during) if during else float("nan"),
        "step_time_increase": slower,
    }


def run_torch(count: int, folder: str) -> dict[str, float]:
    import orjson
    import torch

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.__enter__()
    for _ in range(count):
        with torch.profiler.record_function("bench op"):
            pass
    path = os.path.join(folder, "torch.json")
    t0 = time.perf_counter_ns()
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(path)
    t1 = time.perf_counter_ns()
    with open(path, "rb") as f:
        events = len(orjson.loads(f.read())["traceEvents"])
    os.unlink(path)
    return {"stop_to_written_ms": (t1 - t0) / 1e6, "events": events, "events_per_s": events / ((t1 - t0) / 1e9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--annotations", type=int, default=1_000_000)
    ap.add_argument("--device-rows", type=int, default=1_000_000)
    ap.add_argument("--torch-annotations", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    backend = BenchBackend()
    backend.device_rows = args.device_rows
    polyprof.register_backend(backend)
    folder = scratch_folder()
    runs = [run_polyprof(backend, args.annotations, folder) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    results: dict = {"polyprof": {k: round(v, 3) for k, v in med.items()}, "polyprof_runs": runs}
    if "wait" in inspect.signature(polyprof.Profile.stop).parameters:
        steps = [step_times_during_background(backend, args.annotations, folder) for _ in range(args.repeats)]
        results["training_loop"] = {k: round(statistics.median(r[k] for r in steps), 3) for k in steps[0]}
    if not args.no_torch:
        try:
            truns = [run_torch(args.torch_annotations, folder) for _ in range(args.repeats)]
        except ImportError:
            truns = []
        if truns:
            tmed = {k: statistics.median(r[k] for r in truns) for k in truns[0]}
            results["torch"] = {k: round(v, 3) for k, v in tmed.items()}
            results["events_per_s_ratio"] = round(med["events_per_s"] / tmed["events_per_s"], 2)
    report("stop_to_trace", results)


if __name__ == "__main__":
    main()
