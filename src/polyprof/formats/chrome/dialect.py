"""What both JSON readers (the reference reader and the C scanner's) and the converter agree on about
Kineto's dialect: the flow categories, the envelope pids some writers add, and how a metadata row
(``ph: "M"``) names and orders a process or thread."""

from __future__ import annotations

import math
from typing import Any

from polyprof.model import FLOW_AC2G, FLOW_FWDBWD, Device, Resource

FLOW_TYPES = {"ac2g": FLOW_AC2G, "fwdbwd": FLOW_FWDBWD}
ENVELOPE_PIDS = ("Spans", "Traces")


def metadata_row(
    ev: dict, devices: list[Device], resources: list[Resource], device: Any, resource: Any
) -> None:
    name, args = ev.get("name"), ev.get("args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"a metadata row ({str(name)[:40]}) has args that are not an object")
    dev = device(ev.get("pid"))
    is_thread = name in ("thread_name", "thread_sort_index")
    apply_metadata(name, args, devices[dev], resources[resource(dev, ev.get("tid"))] if is_thread else None)


def apply_metadata(name: Any, args: dict, device: Device, resource: Resource | None) -> None:
    """A process or thread metadata row (``ph: "M"``) applied to its device or its thread."""
    if name == "process_name":
        device.name = str(args.get("name", device.name))
    elif name == "process_labels":
        device.label = str(args.get("labels", ""))
        if device.label == "CPU":
            device.type = "cpu"
        elif device.label.startswith("GPU"):  # Kineto's label of every GPU process
            device.type = "gpu"
    elif name == "process_sort_index":
        device.sort_index = _int(args.get("sort_index", 0))
    elif name == "thread_name" and resource is not None:
        resource.name = str(args.get("name", ""))
    elif name == "thread_sort_index" and resource is not None:
        resource.sort_index = _int(args.get("sort_index", 0))


def _int(value: Any) -> int:
    """A sort index as written, or 0 when it is not a number that fits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return int(max(min(value, 2**62), -(2**62)))
