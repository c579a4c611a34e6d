"""A capture that starts at the same training step on every rank.

``polyprof run --duration D`` under torchrun (``WORLD_SIZE`` > 1) does not start recording with the
script: ranks reach the same step at different times (imports, data loading, the rendezvous), and a
window that starts with each process would compare different steps. Instead, once
``init_process_group`` returns, rank 0 names the optimizer step to start after (the next one) through
the job's store, every rank counts its optimizer steps (``torch.optim``'s global step post-hook, the
same signal Kineto's on-demand tracing uses), and each starts recording right after that step::

    start = SyncedStart(on_start=begin_window)   # begin_window() runs on the training thread
    start.install()                              # now, or when the script imports torch
    ...
    start.agreed_step                            # the step every rank started after (None: not yet)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from polyprof.backends.torch.distributed import job_store
from polyprof.backends.torch.import_hook import PostImportHook

AGREE_TIMEOUT_S = 60.0


def distributed_launch() -> bool:
    """Whether this process is one rank of several, as torchrun (or an env:// launch) says."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


class SyncedStart:
    def __init__(self, on_start: Callable[[], None]) -> None:
        self.on_start = on_start
        self.agreed_step: int | None = None
        self.steps = 0
        self.started = False
        self.problem = ""
        self._hook: PostImportHook | None = None
        self._handle: Any = None
        self._original_init: Any = None

    def install(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "optim"):
            self._with_torch(torch)
        else:
            self._hook = PostImportHook("torch", self._with_torch)
            self._hook.install()

    def _with_torch(self, torch: Any) -> None:
        try:
            import torch.distributed as dist
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except Exception as exc:  # a torch without these: nothing to agree on
            self.problem = f"torch has no optimizer step hook or distributed package ({exc})"
            return
        self._handle = register_optimizer_step_post_hook(self._stepped)
        if dist.is_available() and dist.is_initialized():
            self._agree(dist)
            return
        original = dist.init_process_group
        watch = self

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            watch._agree(dist)
            return result

        init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        self._original_init = original
        dist.init_process_group = init_process_group

    def _agree(self, dist: Any) -> None:
        """Rank 0 names the step to start after (its next); the others read it from the store."""
        key = f"polyprof/run/start_step/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        try:
            store = job_store(AGREE_TIMEOUT_S)
            if store is None:
                raise RuntimeError("MASTER_ADDR/MASTER_PORT do not say where the job's store is")
            if dist.get_rank() == 0:
                store.set(key, str(self.steps + 1))
            store.wait([key], timedelta(seconds=AGREE_TIMEOUT_S))
            self.agreed_step = int(store.get(key))
        except Exception as exc:  # no store to reach: start at this rank's next step, said in the trace
            self.problem = f"the start step could not be agreed through the store ({type(exc).__name__}: {exc})"
            self.agreed_step = self.steps + 1

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if not self.started and self.agreed_step is not None and self.steps >= self.agreed_step:
            self.started = True
            self.remove()
            self.on_start()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        dist = sys.modules.get("torch.distributed")
        if self._original_init is not None and dist is not None:
            if getattr(dist.init_process_group, "__wrapped__", None) is self._original_init:
                dist.init_process_group = self._original_init
            self._original_init = None
