"""polyprof-rocm: AMD GPUs on polyprof's timeline. Kernels, memory copies and HIP runtime calls through
rocprofiler-sdk (:mod:`.rocprofiler_backend`, backend ``rocm``), GPU counters through amdsmi
(:mod:`.amdsmi_backend`). Importing this package imports nothing of ROCm."""

__version__ = "0.1.0"
