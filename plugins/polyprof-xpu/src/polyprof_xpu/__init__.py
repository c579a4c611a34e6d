"""polyprof-xpu: Intel GPUs on polyprof's timeline through PTI-sdk's View API (ctypes on libpti_view).

PTI must be loaded before the SYCL runtime starts to see SYCL-level calls. ``polyprof run`` does that
(it probes backends, which loads PTI, before the script runs). A program that imports torch itself
should call :func:`load_early` first::

    import polyprof_xpu; polyprof_xpu.load_early()
    import torch
"""

from polyprof_xpu.xpu_backend import XpuBackend, backend

__version__ = "0.1.0"
__all__ = ["XpuBackend", "backend", "load_early"]


def load_early() -> str:
    """Load libpti_view now (before the SYCL runtime). Returns the PTI version, or why it failed."""
    from polyprof_xpu.library import PtiUnavailable

    try:
        return backend._library().version_string
    except PtiUnavailable as exc:
        return str(exc)
