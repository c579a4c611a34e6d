"""Synthetic ranks of a data-parallel job, as Kineto-dialect traces that HTA and polyprof both read:
per step, host ops launching GEMMs, elementwise kernels and copies on a compute stream, and one NCCL
all-reduce on a communication stream that overlaps the last kernels; ``distributedInfo`` names the rank.

    trace = job_trace(rank=3, world=64, events=20_000)
"""

from __future__ import annotations

import numpy as np

from polyprof.model import ActivityBuilder, ActivityKind, Device, Resource, Trace

K = ActivityKind
#: Kineto's kernel args name the device and stream (HTA finds device work by them)
KERNELS = ["void gemm_kernel<128>(float const*, float*)", "void gemm_kernel<64>(float const*, float*)",
           "void elementwise_kernel<float>(float*)", "void softmax_kernel(float*)"]
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def job_trace(rank: int, world: int, events: int, seed: int = 0) -> Trace:
    """About `events` rows for `rank` (a step is ~100 rows: 24 launches and their device work, ops, one
    all-reduce); each rank's steps a little longer or shorter than the others'."""
    rng = np.random.default_rng(seed * 100_003 + rank)
    b = ActivityBuilder()
    steps = max(1, events // 100)
    t = 1_000_000
    corr = 1
    stream_free = 0  # a stream runs its work one after the other
    for step in range(steps):
        step_start = t
        for _ in range(24):
            op = int(rng.integers(0, 40))
            op_start = t
            b.append(K.CPU_OP, "cpu_op", f"aten::op_{op}", 0, 0, t, t + 30_000, external_id=corr)
            b.append(K.RUNTIME, "cuda_runtime", "cudaLaunchKernel", 0, 0, t + 5_000, t + 9_000, correlation=corr,
                     external_id=corr)
            kind = K.GPU_MEMCPY if op % 10 == 0 else K.KERNEL
            name = "Memcpy HtoD (Pageable -> Device)" if kind == K.GPU_MEMCPY else KERNELS[op % len(KERNELS)]
            k_start = max(stream_free, op_start + 12_000 + int(rng.integers(0, 20_000)))
            stream_free = k_start + int(rng.integers(5_000, 60_000))
            b.append(kind, kind.name.lower(), name, 1, 1, k_start, stream_free, correlation=corr,
                     args={"device": 0, "stream": 7})
            t += 32_000 + int(rng.integers(0, 4_000))
            corr += 1
        b.append(K.RUNTIME, "cuda_runtime", "ncclKernelLaunch", 0, 0, t, t + 5_000, correlation=corr)
        b.append(K.KERNEL, "kernel", NCCL, 1, 2, t - 100_000, t + 200_000 + int(rng.integers(0, 50_000)),
                 correlation=corr, args={"device": 0, "stream": 13, "Collective name": "allreduce", "In msg nelems": 1 << 20, "dtype": "Float",
                                         "Group size": world, "Process Group Name": "0"})
        corr += 1
        t += 300_000
        b.append(K.USER_ANNOTATION, "user_annotation", f"ProfilerStep#{step}", 0, 0, step_start, t)
    devices = [Device("host", "cpu", 0, f"node{rank // 8}", pid=1000 + rank),
               Device("cuda:0", "gpu", 0, "GPU 0", label="GPU 0", pid=0)]
    resources = [Resource(0, 1000 + rank, "main thread"), Resource(1, 7, "stream 7"), Resource(1, 13, "stream 13")]
    meta = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}}
    return Trace(activities=b.freeze(), devices=devices, resources=resources, metadata=meta)
