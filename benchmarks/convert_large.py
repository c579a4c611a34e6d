"""`polyprof convert` on a large Kineto JSON: throughput and peak memory.

    .venv/bin/python benchmarks/convert_large.py [--gb 1.0]

Generates a Kineto-dialect trace of about `--gb` GB as torch.profiler writes it for a CUDA training
step (aten ops with record_shapes args, cuda_runtime launches with ac2g flows to kernels on two
streams, Kineto's metadata rows and top-level keys), then runs `python -m polyprof convert IN
OUT.pftrace` in a child process and reports wall time, MB/s of input and the child's peak RSS
(its VmHWM). Target (issue #15): peak RSS at most 1/2 of the input size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import orjson
from _common import report, run_polyprof_measured


def write_kineto_json(path: str, target_bytes: int) -> int:
    """A Kineto-like trace of about `target_bytes`; returns the number of events written."""
    pid, tid = 4242, 4243
    events = 0
    with open(path, "wb") as f:
        f.write(b'{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150000000000}],\n')
        f.write(b'  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},\n  "displayTimeUnit": "ms",\n')
        f.write(b'  "baseTimeNanoseconds": 1764547200000000000,\n  "traceEvents": [\n')
        ts, corr, seq = 1_000.0, 1, 1
        written, first = 0, True
        while written < target_bytes:
            batch = []
            for _ in range(2000):
                op_ts = ts
                batch.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": pid, "tid": tid, "ts": op_ts, "dur": 30.5,
                              "args": {"External id": corr, "Record function id": 0, "Sequence number": seq, "Fwd thread id": 0,
                                       "Concrete Inputs": ["", "", ""], "Input type": ["float", "float", "float"],
                                       "Input Strides": [[512, 1], [512, 1], [1]], "Input Dims": [[64, 512], [512, 512], [512]],
                                       "Ev Idx": corr}})
                batch.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                              "ts": op_ts + 10.0, "dur": 5.25, "args": {"External id": corr, "cbid": 211, "correlation": corr}})
                batch.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": op_ts + 10.0, "cat": "ac2g", "name": "ac2g"})
                stream = 7 + corr % 2
                batch.append({"ph": "X", "cat": "kernel", "name": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
                              "pid": 0, "tid": stream, "ts": op_ts + 20.0, "dur": 12.125,
                              "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": stream,
                                       "correlation": corr, "registers per thread": 232, "shared memory": 49152,
                                       "blocks per SM": 0.25, "warps per SM": 1.0, "grid": [4, 4, 1], "block": [128, 1, 1],
                                       "est. achieved occupancy %": 6}})
                batch.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": op_ts + 20.0, "cat": "ac2g", "name": "ac2g", "bp": "e"})
                ts += 40.0
                corr += 1
                seq += 1
            chunk = b",\n".join(orjson.dumps(e) for e in batch)
            if not first:
                f.write(b",\n")
            f.write(chunk)
            first = False
            written += len(chunk)
            events += len(batch)
        meta = [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"name": "process_labels", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
            {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "python"}},
            {"name": "process_labels", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": "thread 4243 (python)"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 8, "args": {"name": "stream 8"}},
        ]
        f.write(b",\n" + b",\n".join(orjson.dumps(e) for e in meta))
        f.write(b'\n  ],\n  "traceName": "rank0.pt.trace.json"\n}\n')
    return events + len(meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gb", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as folder:
        src, dst = os.path.join(folder, "big.pt.trace.json"), os.path.join(folder, "big.pftrace")
        t0 = time.perf_counter()
        events = write_kineto_json(src, int(args.gb * 1e9))
        generated = time.perf_counter() - t0
        size = os.path.getsize(src)
        seconds, peak, said = run_polyprof_measured(["convert", src, dst])
        report(
            "convert_large",
            {
                "input_bytes": size,
                "input_events": events,
                "generate_seconds": round(generated, 1),
                "convert_seconds": round(seconds, 1),
                "mb_per_s": round(size / seconds / 1e6, 1),
                "peak_rss_bytes": peak,
                "peak_rss_over_input": round(peak / size, 3),
                "output_bytes": os.path.getsize(dst),
                "output_over_input": round(os.path.getsize(dst) / size, 3),
                "target_peak_rss_over_input_max": 0.5,
                "meets_target": peak <= size / 2,
                "convert_said": said.strip().splitlines()[-1],
            },
        )


if __name__ == "__main__":
    main()
