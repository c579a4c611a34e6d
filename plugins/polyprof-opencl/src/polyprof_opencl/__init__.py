"""polyprof-opencl: OpenCL devices on polyprof's timeline, through pyopencl.

Importing this package does not import pyopencl; the backend does, when a profile needs it.

::

    import polyprof
    from polyprof.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.OPENCL]) as prof:
        run_opencl_code()
    prof.export_chrome_trace("trace.json")

Queues created while a profile records are made profiling-enabled automatically. For queues created
earlier, call :func:`enable_queue_profiling` before creating them (or pass
``properties=cl.command_queue_properties.PROFILING_ENABLE``).
"""

from polyprof_opencl.intercept import disable_queue_profiling, enable_queue_profiling
from polyprof_opencl.opencl_backend import OpenCLBackend, backend

__version__ = "0.1.0"
__all__ = ["OpenCLBackend", "backend", "disable_queue_profiling", "enable_queue_profiling"]
