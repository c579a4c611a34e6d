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


#: how many elements a collective's output holds per input element, by Kineto's collective name
#: (allgather: one input per rank of the group)
_OUT_PER_IN = {"allreduce": 1, "broadcast": 1, "reduce": 1, "barrier": 1, "send": 1, "recv": 1, "allgather": None}


def collective_args(args: dict[str, Any], info: dict[str, Any] | None) -> dict[str, Any]:
    """A collective's args completed as Kineto's ``record_param_comms`` has them. For a c10d Work span
    (gloo's ``gloo:all_reduce``...), the observer gives "Collective name", "In msg nelems" and "dtype";
    where the job has one process group (the collective ran on it) its fields come from `info`
    (distributedInfo): "Out msg nelems", "Group size", "Rank", "Process Group Name", "Process Group
    Description", "Process Group Ranks", "Global rank start" and "Global rank stride". With several
    groups a Work span does not say which it ran on: those are left out. NCCL's own args pass as they are.

        collective_args({"Collective name": "allreduce", "In msg nelems": 8}, distributed_info())
    """
    if "Collective name" not in args or "Group size" in args or not info:
        return args
    configs = info.get("pg_config")
    if info.get("pg_count") != 1 or not isinstance(configs, list) or len(configs) != 1 or not isinstance(configs[0], dict):
        return args
    group = configs[0]
    ranks = [r for r in group.get("ranks") or [] if isinstance(r, int)]
    size = group.get("pg_size") if isinstance(group.get("pg_size"), int) else len(ranks)
    out = dict(args)
    per = _OUT_PER_IN.get(str(args["Collective name"]), 0)
    nelems = args.get("In msg nelems")
    if isinstance(nelems, int) and per != 0:
        out["Out msg nelems"] = nelems * (size if per is None else per)
    out["Group size"] = size
    if info.get("rank") in ranks:
        out["Rank"] = ranks.index(info["rank"])
    out["Process Group Name"] = str(group.get("pg_name", ""))
    out["Process Group Description"] = str(group.get("pg_desc", ""))
    out["Process Group Ranks"] = "[" + ", ".join(map(str, ranks)) + "]"  # a string, as Kineto writes it
    if ranks:
        stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
        if stride > 0 and ranks == list(range(ranks[0], ranks[0] + stride * len(ranks), stride)):
            out["Global rank start"], out["Global rank stride"] = ranks[0], stride
    return out


class DistributedWatch:
    """The last ``distributedInfo`` of the job, and this rank's clock against rank 0's (see
    :mod:`.clock_sync`), kept while a profile records: measured when the profile starts in a running
    job or right after ``init_process_group`` returns (every rank is past the rendezvous then), and
    when the profile stops (in the background) or right before ``destroy_process_group`` (waited for
    there: every rank is done with its collectives)."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None
        self.sync_start: Any = None
        self.sync_stop: Any = None
        self._dist: Any = None
        self._originals: dict[str, Any] = {}

    def note(self) -> None:
        info = distributed_info()
        if info is not None:
            self.info = info

    def _measure(self, when: str) -> Any:
        from polyprof.backends.torch.clock_sync import ClockSync

        if when == "start" and self.sync_start is None:
            self.sync_start = ClockSync.start_measuring("start")
        elif when == "stop" and self.sync_stop is None and self.sync_start is not None:
            self.sync_stop = ClockSync.start_measuring("stop")
        return self.sync_start if when == "start" else self.sync_stop

    def install(self) -> None:
        """Note the job now, after its process group is made and before it is destroyed."""
        self.note()
        try:
            import torch.distributed as dist
        except Exception:  # a torch without distributed support
            return
        if self._dist is not None or not hasattr(dist, "destroy_process_group"):
            return
        if self.info is not None:
            self._measure("start")
        watch = self
        init, destroy = dist.init_process_group, dist.destroy_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = init(*args, **kwargs)
            watch.note()
            watch._measure("start")
            return result

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            watch.note()
            sync = watch._measure("stop")
            if sync is not None:  # every rank is done with its collectives: measure before the group goes
                sync.finish()  # (rank 0 until it has answered every rank; a few ms, at most the time limit)
            if getattr(dist, "destroy_process_group", None) is destroy_process_group:  # left by remove()
                dist.destroy_process_group = destroy
            return destroy(*args, **kwargs)

        init_process_group.__wrapped__ = init  # type: ignore[attr-defined]
        destroy_process_group.__wrapped__ = destroy  # type: ignore[attr-defined]
        self._dist, self._originals = dist, {"init_process_group": init, "destroy_process_group": destroy}
        dist.init_process_group, dist.destroy_process_group = init_process_group, destroy_process_group

    def remove(self) -> None:
        self.note()
        measuring = None
        if self.info is not None and distributed_info() is not None:
            # in the background: a rank waiting here could hold up a collective that another rank must
            # finish before it stops too (the result is read at collect, on the background writer)
            measuring = self._measure("stop")
        for name, original in self._originals.items():
            if name == "destroy_process_group" and measuring is not None:
                # stays until it is called: rank 0's store (the pings go through it) ends with the
                # group, so a destroy right after the profile waits for the stop pings first
                continue
            if getattr(getattr(self._dist, name, None), "__wrapped__", None) is original:
                setattr(self._dist, name, original)
        self._dist, self._originals = None, {}

    def clock_summary(self, wait_s: float = 3.0) -> dict[str, Any] | None:
        """The offsets measured; a measurement still going after `wait_s` is said to be (collect may
        run on the training thread, which must not wait long on other ranks: the stop pings take
        milliseconds when the ranks stop together, but a loaded machine can delay rank 0's answers
        past a second)."""
        from polyprof.backends.torch.clock_sync import summarize

        return summarize(self.sync_start, self.sync_stop, wait_s)
