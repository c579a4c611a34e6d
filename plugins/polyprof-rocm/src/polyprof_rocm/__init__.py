"""polyprof-rocm: AMD GPUs on polyprof's timeline. So far GPU counters through amdsmi
(:mod:`.amdsmi_backend`); kernel and copy tracing through rocprofiler-sdk is to come (issue #20).
Importing this package imports nothing of ROCm."""

__version__ = "0.1.0"
