import pytest


def _opencl_device_or_reason():
    try:
        import pyopencl as cl
    except ImportError as exc:
        return None, f"needs pyopencl ({exc})"
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except Exception as exc:
        return None, f"needs an OpenCL platform; install pocl-binary-distribution ({exc})"
    if not devices:
        return None, "needs an OpenCL device; install pocl-binary-distribution"
    return devices, ""


DEVICES, REASON = _opencl_device_or_reason()
requires_opencl = pytest.mark.skipif(DEVICES is None, reason=REASON or "needs an OpenCL device")


@pytest.fixture
def cl():
    if DEVICES is None:
        pytest.skip(REASON)
    import pyopencl

    return pyopencl


@pytest.fixture
def context(cl):
    return cl.Context(devices=[DEVICES[0]])


KERNELS = """
__kernel void add_one(__global float *x) { int i = get_global_id(0); x[i] += 1.0f; }
__kernel void busy(__global float *x, int rounds) {
    int i = get_global_id(0); float v = x[i];
    for (int r = 0; r < rounds; r++) v = v * 0.999f + 0.001f;
    x[i] = v;
}
"""


@pytest.fixture
def program(cl, context):
    return cl.Program(context, KERNELS).build()
