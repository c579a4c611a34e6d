"""Device work by kind, as Holistic Trace Analysis (HTA 0.5) names it, and a device's name in summaries:
what the in-memory analyses and the store's tables both classify by.

::

    work = DeviceWork(trace)          # the trace's kernels, copies and fills, each with its kind of work
    work.type                         # COMPUTATION / COMMUNICATION / MEMORY / OTHER per row
    work_type("ncclDevKernel_AllReduce", ActivityKind.KERNEL)    # "COMMUNICATION"
    device_heading(trace, 1)          # "GPU 0 (host)"

Communication is ``nccl...Kernel``; memory is ``Memcpy...``, ``Memset...``, ``dma...`` (and every copy
and fill, whatever its name); other is what HTA leaves out of computation (names with Memcpy/Memset
inside, or ending in Sync...); computation is the rest.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from polyprof.model.kinds import ActivityKind

DEVICE_ROW_KINDS = (int(ActivityKind.KERNEL), int(ActivityKind.GPU_MEMCPY), int(ActivityKind.GPU_MEMSET))
COMMUNICATION, COMPUTATION, MEMORY, OTHER = "COMMUNICATION", "COMPUTATION", "MEMORY", "OTHER"
_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def device_heading(trace: Any, index: int) -> str:
    """How a device is named in summaries: its process name, with its label ("GPU 0") where that says
    more; just the label where several devices share a name (Kineto names every GPU process after the
    host)."""
    dev = trace.devices[index]
    name = dev.name or dev.key
    label = dev.label
    if not label or label == "CPU" or label in name:
        return name
    shared = sum(1 for d in trace.devices if (d.name or d.key) == name) > 1
    return label if shared or name == trace.metadata.get("host_name") else f"{label} ({name})"


def work_type(name: str, kind: int) -> str:
    if _COMM.match(name):
        return COMMUNICATION
    if kind != int(ActivityKind.KERNEL) or _MEMORY.match(name):
        return MEMORY
    if _NOT_COMPUTE.match(name):
        return OTHER
    return COMPUTATION


class DeviceWork:
    """The device rows of a trace, by device, with their kinds of work (computed once per trace)."""

    def __init__(self, trace: Any) -> None:
        acts = trace.activities
        self.trace = trace
        kinds = acts["kind"].astype(np.int64) if len(acts) else np.zeros(0, np.int64)
        self.rows = np.flatnonzero(np.isin(kinds, DEVICE_ROW_KINDS))
        names = acts.strings.strings
        codes = acts["name"][self.rows].astype(np.int64) if len(self.rows) else np.zeros(0, np.int64)
        self.kind = kinds[self.rows]
        pairs, inverse = np.unique(codes * 256 + self.kind, return_inverse=True)  # each (name, kind) once
        types = np.array([work_type(names[int(p) // 256], int(p) % 256) for p in pairs.tolist()], dtype=object)
        self.type = types[inverse] if len(pairs) else np.zeros(0, dtype=object)
        self.name = codes
        self.device = acts["device"][self.rows].astype(np.int64) if len(self.rows) else codes
        self.resource = acts["resource"][self.rows].astype(np.int64) if len(self.rows) else codes
        self.start = acts["start"][self.rows] if len(self.rows) else codes
        self.end = acts["end"][self.rows] if len(self.rows) else codes
        self.correlation = acts["correlation"][self.rows] if len(self.rows) else codes

    def devices(self) -> list[int]:
        return sorted(set(self.device.tolist()), key=lambda d: (self.trace.devices[d].sort_index, d))

    def on(self, device: int, work: str | None = None) -> np.ndarray:
        mask = self.device == device
        if work is not None:
            mask &= self.type == work
        return mask

    def heading(self, device: int) -> str:
        return device_heading(self.trace, device)
