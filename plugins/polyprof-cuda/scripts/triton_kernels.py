"""A Triton kernel for scripts/device-check.py (Triton reads a kernel's source from its module file).

Triton launches through the driver API (cuLaunchKernelEx), so its kernels test polyprof-cuda's
driver-launch linkage.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def polyprof_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    polyprof_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out
