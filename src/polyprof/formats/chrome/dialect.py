"""What both JSON readers (the reference reader and the C scanner's) and the converter agree on about
Kineto's dialect: the flow categories, the envelope pids some writers add, how a ``pid`` and ``tid``
become a device and a row (:func:`pid_device`, :func:`tid_resource`, :class:`Places`), and how a
metadata row (``ph: "M"``) names and orders a process or thread."""

from __future__ import annotations

import math
from typing import Any

from polyprof.model import FLOW_AC2G, FLOW_FWDBWD, Device, Resource

FLOW_TYPES = {"ac2g": FLOW_AC2G, "fwdbwd": FLOW_FWDBWD}
ENVELOPE_PIDS = ("Spans", "Traces")


def _fits(value: Any, bits: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def pid_device(pid: Any, index: int) -> Device:
    """The device of the `index`-th distinct ``pid`` of a file: an int32 pid is its own, any other
    value (a string, a float, a pid beyond 32 bits) gets a negative one of its own."""
    pid_int = pid if _fits(pid, 32) else -1 - index
    return Device(f"pid:{pid}", "unknown", max(pid_int, 0), f"process {pid}", pid=pid_int)


def tid_resource(device: int, tid: Any, index: int) -> Resource:
    """The row of the `index`-th distinct (device, ``tid``) of a file: an int64 tid is its own, any
    other value is numbered by `index`."""
    tid_int = tid if _fits(tid, 64) else index
    return Resource(device, tid_int, f"thread {tid}", tid_int)


class Places:
    """The devices and rows of a file, by pid and (device, tid), made as they are first seen::

        places = Places()
        row = places.resource(places.device(ev["pid"]), ev["tid"])
    """

    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.resources: list[Resource] = []
        self._dev: dict[Any, int] = {}
        self._res: dict[tuple[int, Any], int] = {}

    def device(self, pid: Any) -> int:
        idx = self._dev.get(pid)
        if idx is None:
            idx = self._dev[pid] = len(self.devices)
            self.devices.append(pid_device(pid, idx))
        return idx

    def resource(self, dev: int, tid: Any) -> int:
        idx = self._res.get((dev, tid))
        if idx is None:
            idx = self._res[(dev, tid)] = len(self.resources)
            self.resources.append(tid_resource(dev, tid, idx))
        return idx


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
