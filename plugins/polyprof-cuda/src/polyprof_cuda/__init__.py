"""polyprof-cuda: NVIDIA GPUs on polyprof's timeline through CUPTI's Activity API (cupti-python).

Importing this package imports neither cupti-python nor CUDA; the backend does, when a profile
needs group CUDA. Works for any CUDA code in the process (PyTorch, CuPy, Numba, Triton, cuda-python).
"""

from polyprof_cuda.cuda_backend import CudaBackend, backend

__version__ = "0.1.0"
__all__ = ["CudaBackend", "backend"]
