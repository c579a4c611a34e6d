"""polyprof's own client of a torch.distributed job's store, for what polyprof agrees on across ranks
(the clock against rank 0, the base time, the step a window starts at, on-demand job captures).

::

    store = job_store(timeout_s=5.0)   # None where the job did not say where its store is
"""

from __future__ import annotations

from typing import Any


def job_store(timeout_s: float) -> Any:
    """A client of polyprof's own to the job's TCPStore (MASTER_ADDR:MASTER_PORT, what torchrun and an
    env:// launch set): the job's own client is never shared with polyprof's threads. None when the job
    did not say where its store is."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    return dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
