"""What a trace records of a torch.distributed job: ``distributedInfo`` exactly as torch.profiler
writes it (backend, rank, world_size, pg_count, pg_config, and nccl_version with NCCL).

A job often ends its process group before the profile stops (``polyprof run`` stops after the script),
so :class:`DistributedWatch` keeps the last description seen: at start, at each flush and stop, and
just before ``torch.distributed.destroy_process_group`` runs (wrapped while a profile records)."""

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


class DistributedWatch:
    """The last ``distributedInfo`` of the job, kept while a profile records."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None
        self._dist: Any = None
        self._original: Any = None

    def note(self) -> None:
        info = distributed_info()
        if info is not None:
            self.info = info

    def install(self) -> None:
        """Note the job now, and before its process group is destroyed."""
        self.note()
        try:
            import torch.distributed as dist
        except Exception:  # a torch without distributed support
            return
        original = getattr(dist, "destroy_process_group", None)
        if dist is None or original is None or self._original is not None:
            return
        watch = self

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            watch.note()
            return original(*args, **kwargs)

        destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        self._dist, self._original = dist, original
        dist.destroy_process_group = destroy_process_group

    def remove(self) -> None:
        self.note()
        if self._dist is not None and getattr(self._dist.destroy_process_group, "__wrapped__", None) is self._original:
            self._dist.destroy_process_group = self._original
        self._dist = self._original = None
