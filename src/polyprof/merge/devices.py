"""The trace's devices and resources: every backend's, with pids that do not collide."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np

from polyprof.model import HOST_DEVICE_KEY, Device, Resource


def host_process_name() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"python {argv0}".strip()


class DeviceTable:
    """Global devices and resources; each part's handles map onto them (``device_map``/``resource_map``)."""

    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.resources: list[Resource] = []
        self._by_key: dict[str, int] = {}
        self._res: dict[tuple[int, int], int] = {}
        self._pids: set[int] = set()
        host = Device(HOST_DEVICE_KEY, "cpu", 0, host_process_name(), {}, 0, os.getpid(), "CPU")
        self._add(host)

    def _add(self, device: Device) -> int:
        pid = device.pid
        if pid < 0 or pid in self._pids:
            pid = max(self._pids | {1_000_000}) + 1
        device.pid = pid
        self._pids.add(pid)
        self._by_key[device.key] = len(self.devices)
        self.devices.append(device)
        return len(self.devices) - 1

    def device_map(self, local: Sequence[Device]) -> np.ndarray:
        mapping = []
        for d in local:
            idx = self._by_key.get(d.key)
            if idx is None:
                idx = self._add(
                    Device(d.key, d.type, d.index, d.name, dict(d.properties), d.sort_index, d.pid, d.label)
                )
            elif d.key != HOST_DEVICE_KEY and d.properties and not self.devices[idx].properties:
                self.devices[idx].properties = dict(d.properties)
            mapping.append(idx)
        return np.array(mapping, dtype=np.int32)

    def resource_map(self, local: Sequence[Resource], device_map: np.ndarray) -> np.ndarray:
        mapping = []
        zero_ids = self._zero_row_ids(local, device_map)
        for r in local:
            dev = int(device_map[r.device])
            key = (dev, r.id)
            idx = self._res.get(key)
            if idx is None:
                idx = self._res[key] = len(self.resources)
                rid = zero_ids.get(dev, r.id) if r.id == 0 else r.id
                self.resources.append(Resource(dev, rid, r.name, r.sort_index))
            mapping.append(idx)
        return np.array(mapping, dtype=np.int32)

    def _zero_row_ids(self, local: Sequence[Resource], device_map: np.ndarray) -> dict[int, int]:
        """For each device (not the host) with a row 0, the trace thread id that row gets instead: one
        above every id of that device. Perfetto takes a thread id 0 for the process's own track (a
        device's row 0 would merge with it), HTA for a stream without iterations."""
        ids: dict[int, set[int]] = {}
        for r in local:
            ids.setdefault(int(device_map[r.device]), set()).add(r.id)
        for r in self.resources:
            ids.setdefault(r.device, set()).add(r.id)
        return {
            dev: max(taken) + 1
            for dev, taken in ids.items()
            if dev != 0 and 0 in taken and (dev, 0) not in self._res
        }
