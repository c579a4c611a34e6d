"""``tensorboard_trace_handler``: the on_trace_ready callback torch users pass."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any


def tensorboard_trace_handler(
    dir_name: str, worker_name: str | None = None, use_gzip: bool = False, format: str = "json"
) -> Callable[[Any], str]:
    """Returns ``handler(prof)`` writing ``{dir_name}/{worker_name}.{time_ns}.pt.trace.json[.gz]``,
    as torch.profiler's does (default worker name: ``{hostname}_{pid}``); with ``format="perfetto"``,
    ``....pt.trace.pftrace[.gz]`` (Perfetto protobuf: a fraction of the size, for large traces)."""
    from polyprof.formats.common.paths import format_of

    suffix = ".pftrace" if format_of("", format) == "perfetto" else ".json"

    def handler(prof: Any) -> str:
        nonlocal worker_name
        if not os.path.isdir(dir_name):
            try:
                os.makedirs(dir_name, exist_ok=True)
            except Exception as exc:
                raise RuntimeError("Can't create directory: " + dir_name) from exc
        if not worker_name:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        file_name = f"{worker_name}.{time.time_ns()}.pt.trace{suffix}"
        if use_gzip:
            file_name += ".gz"
        return prof.export_chrome_trace(os.path.join(dir_name, file_name))

    return handler
