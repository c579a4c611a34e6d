"""Devices (trace processes) and resources (trace threads: host threads, streams, queues).

Backends declare them; nothing here knows of any particular device type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOST_DEVICE_KEY = "host"


@dataclass
class Device:
    """One timeline process: the host process, a GPU, an OpenCL device...

    `key` is unique within a trace (``"host"``, ``"cuda:0"``, ``"opencl:pocl:0"``); `pid` is the process
    id written to the trace, chosen by the trace when the backend's preferred one is taken.
    """

    key: str
    type: str
    index: int
    name: str
    properties: dict[str, Any] = field(default_factory=dict)
    sort_index: int = 0
    pid: int = -1
    label: str = ""


@dataclass
class Resource:
    """One timeline thread of a device: a host thread, a CUDA stream, an OpenCL queue."""

    device: int  # index into Trace.devices
    id: int  # the tid written to the trace
    name: str
    sort_index: int = 0
