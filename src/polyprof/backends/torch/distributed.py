"""What a trace records of a torch.distributed job: ``distributedInfo`` exactly as torch.profiler
writes it (backend, rank, world_size, pg_count, pg_config, and nccl_version with NCCL)."""

from __future__ import annotations

import sys
from typing import Any


def distributed_info() -> dict[str, Any] | None:
    """``distributedInfo`` for the running job, None when torch.distributed is not initialised (or
    torch is not imported: then there is no job to describe)."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        backend = dist.get_backend()
        info: dict[str, Any] = {
            "backend": backend,
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "pg_count": dist.get_pg_count(),
            "pg_config": dist.distributed_c10d._get_all_pg_configs(),
        }
        if backend == "nccl":
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        return info
    except Exception:  # a job in an odd state must not cost the trace
        return None
