"""Vector addition on an OpenCL device, annotated with polyprof.

    polyprof run --activities cpu,opencl examples/opencl_vector_add.py

Needs the OpenCL plugin and a device (`pip install ./plugins/polyprof-opencl[pocl]` gives a CPU one).
Queues created here are profiling-enabled by polyprof automatically, since the profile is already
recording when the script runs.
"""

import sys

import numpy as np
import pyopencl as cl

import polyprof

KERNELS = """
__kernel void vector_add(__global const float *a, __global const float *b, __global float *out) {
    int i = get_global_id(0);
    out[i] = a[i] + b[i];
}
__kernel void scale(__global float *x, float factor) {
    int i = get_global_id(0);
    x[i] *= factor;
}
"""


def main(n: int = 1 << 16, steps: int = 4) -> float:
    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx)
    program = cl.Program(ctx, KERNELS).build()
    vector_add, scale = program.vector_add, program.scale  # pyopencl makes a new kernel on each lookup
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.empty_like(a)
    mf = cl.mem_flags
    a_buf = cl.Buffer(ctx, mf.READ_ONLY, a.nbytes)
    b_buf = cl.Buffer(ctx, mf.READ_ONLY, b.nbytes)
    out_buf = cl.Buffer(ctx, mf.READ_WRITE, a.nbytes)
    for step in range(steps):
        with polyprof.record_function(f"step {step}"):
            with polyprof.record_function("upload"):
                cl.enqueue_copy(queue, a_buf, a)
                cl.enqueue_copy(queue, b_buf, b)
            with polyprof.record_function("compute"):
                cl.enqueue_fill_buffer(queue, out_buf, np.float32(0), 0, out.nbytes)
                vector_add(queue, (n,), (64,), a_buf, b_buf, out_buf)
                scale(queue, (n,), None, out_buf, np.float32(0.5))
            with polyprof.record_function("download"):
                cl.enqueue_copy(queue, out, out_buf)
    queue.finish()
    expected = (a + b) * 0.5
    assert np.allclose(out, expected), "wrong result"
    return float(out.sum())


if __name__ == "__main__":
    print(f"vector_add result: {main(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 16):.4f}")
