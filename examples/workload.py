"""The bundled example workload: a small training-like pipeline with real device work.

Each step loads a batch (numpy), runs it through an OpenCL kernel chain on the default OpenCL device
(PoCL's CPU device from ``pip install 'polyprof-opencl[pocl]'``, which ``scripts/demo.sh`` installs, or
any GPU driver), and, where torch is installed, a small torch model. A background thread polls and
counts. Each step is a ``ProfilerStep#N`` span, as torch.profiler names steps, so that step analyses
(``polyprof report``) find them. Run it under the profiler (``polyprof run examples/workload.py``) or on its own; without
pyopencl or torch those stages are skipped and say so.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

import polyprof

KERNELS = """
__kernel void scale_add(__global const float *a, __global const float *b, __global float *out, float k) {
    int i = get_global_id(0);
    out[i] = k * a[i] + b[i];
}
__kernel void relu(__global float *x) {
    int i = get_global_id(0);
    x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
"""


class OpenCLStage:
    """Copies a batch to the device, runs two kernels and a fill, copies the result back."""

    def __init__(self) -> None:
        import pyopencl as cl

        self.cl = cl
        self.ctx = cl.create_some_context(interactive=False)
        self.queue = cl.CommandQueue(self.ctx)
        program = cl.Program(self.ctx, KERNELS).build()
        # Looked up once: pyopencl builds a new kernel object on each attribute access.
        self.scale_add, self.relu = program.scale_add, program.relu
        self.device = self.ctx.devices[0].name.strip()

    @polyprof.record_function("opencl stage")
    def __call__(self, batch: np.ndarray) -> float:
        cl, queue = self.cl, self.queue
        a = batch.astype(np.float32).ravel()
        mf = cl.mem_flags
        d_a = cl.Buffer(self.ctx, mf.READ_ONLY, a.nbytes)
        d_b = cl.Buffer(self.ctx, mf.READ_WRITE, a.nbytes)
        d_out = cl.Buffer(self.ctx, mf.READ_WRITE, a.nbytes)
        cl.enqueue_copy(queue, d_a, a)
        cl.enqueue_fill_buffer(queue, d_b, np.float32(0.5), 0, a.nbytes)
        self.scale_add(queue, a.shape, None, d_a, d_b, d_out, np.float32(2.0))
        self.relu(queue, a.shape, None, d_out)
        out = np.empty_like(a)
        cl.enqueue_copy(queue, out, d_out)
        queue.finish()
        return float(out.mean())


class TorchStage:
    """A two-layer model's forward and backward pass on the CPU."""

    def __init__(self, size: int) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(size, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    @polyprof.record_function("torch stage")
    def __call__(self, batch: np.ndarray) -> float:
        x = self.torch.from_numpy(batch.astype(np.float32))
        self.opt.zero_grad()
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def optional_stage(name: str, make: object) -> object | None:
    try:
        return make()  # type: ignore[operator]
    except Exception as exc:  # not installed, or no OpenCL device: the rest of the workload still runs
        print(f"workload: {name} stage skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


@polyprof.record_function("load batch")
def load_batch(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.standard_normal((size, size))


@polyprof.record_function("matmul chain")
def matmul_chain(a: np.ndarray, depth: int) -> np.ndarray:
    out = a
    for i in range(depth):
        with polyprof.record_function(f"layer {i}"):
            out = np.tanh(out @ a)
    return out


def background_io(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        with polyprof.record_function("background poll"):
            stop.wait(0.002)
        n += 1
        polyprof.counter("background polls", n)


def main(steps: int = 8, size: int = 128) -> float:
    rng = np.random.default_rng(0)
    opencl = optional_stage("OpenCL", OpenCLStage)
    torch_stage = optional_stage("torch", lambda: TorchStage(size))
    stop = threading.Event()
    worker = threading.Thread(target=background_io, args=(stop,), name="io-worker")
    worker.start()
    total = 0.0
    try:
        for step in range(steps):
            with polyprof.record_function(f"ProfilerStep#{step}"):  # torch.profiler's name for a step
                batch = load_batch(rng, size)
                result = matmul_chain(batch, depth=3)
                if opencl is not None:
                    total += opencl(result)
                if torch_stage is not None:
                    total += torch_stage(result)
                with polyprof.record_function("reduce"):
                    total += float(np.abs(result).mean())
            polyprof.instant("step done", {"step": step})
    finally:
        stop.set()
        worker.join()
    return total


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(f"workload result: {main(steps):.6f}")
