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


#: a secret the job's ranks share (set it in the launcher's environment: torchrun passes it on); with it,
#: what polyprof puts in the store is sealed and what it reads is checked (docs/threat-model.md)
SECRET = "POLYPROF_JOB_SECRET"


def seal(message: Any) -> bytes:
    """`message` as polyprof puts it in the job's store: JSON, and with POLYPROF_JOB_SECRET set, inside
    ``{"body": ..., "mac": HMAC-SHA256}`` so that a process without the secret cannot forge it."""
    import os

    import orjson

    body = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    secret = os.environ.get(SECRET, "")
    return b'{"body":' + body + b',"mac":"' + _mac(secret, body).encode() + b'"}' if secret else body


def unseal(raw: Any) -> Any:
    """What :func:`seal` made, read back: the message, or None when it cannot be trusted (not JSON; with
    POLYPROF_JOB_SECRET set, not sealed with it)."""
    import hmac
    import os

    import orjson

    try:
        message = orjson.loads(raw)
    except (TypeError, ValueError):
        return None
    secret = os.environ.get(SECRET, "")
    if not secret:
        return message
    if not isinstance(message, dict) or set(message) != {"body", "mac"} or not isinstance(message["mac"], str):
        return None
    body = orjson.dumps(message["body"], option=orjson.OPT_SORT_KEYS)
    return message["body"] if hmac.compare_digest(_mac(secret, body), message["mac"]) else None


def _mac(secret: str, body: bytes) -> str:
    import hashlib
    import hmac

    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
