"""Counter samples (a name, a device, a time, a value), written as Chrome `C` events."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CounterSample:
    name: str
    device: int  # index into Trace.devices
    ts: int  # host-clock ns
    value: float
    resource: int = -1  # optional thread the sample belongs to


@dataclass
class Counters:
    samples: list[CounterSample] = field(default_factory=list)

    def add(self, name: str, device: int, ts: int, value: float, resource: int = -1) -> None:
        self.samples.append(CounterSample(name, device, ts, value, resource))

    def __len__(self) -> int:
        return len(self.samples)
