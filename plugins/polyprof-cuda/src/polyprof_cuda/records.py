"""CUPTI activity records -> compact tuples (in CUPTI's buffer callback) -> polyprof activities.

The buffer-completed callback runs on a CUPTI thread while the program keeps running, and the record
objects may be views into CUPTI's buffer, so it only copies the fields used here into tuples (one
layout per record family) and returns. Everything else happens at collect time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

# Record families.
KERNEL, MEMCPY, MEMCPY_P2P, MEMSET, RUNTIME, DRIVER, SYNC, OVERHEAD, EXTERNAL = (
    "kernel",
    "memcpy",
    "memcpy_p2p",
    "memset",
    "runtime",
    "driver",
    "sync",
    "overhead",
    "external",
)

#: CUPTI ActivityKind names -> family. CONCURRENT_KERNEL and KERNEL share a layout.
KIND_FAMILIES = {
    "CONCURRENT_KERNEL": KERNEL,
    "KERNEL": KERNEL,
    "MEMCPY": MEMCPY,
    "MEMCPY2": MEMCPY_P2P,
    "MEMSET": MEMSET,
    "RUNTIME": RUNTIME,
    "DRIVER": DRIVER,
    "SYNCHRONIZATION": SYNC,
    "OVERHEAD": OVERHEAD,
    "EXTERNAL_CORRELATION": EXTERNAL,
}

#: Activity kinds enabled by default (what Kineto's CUDA path records).
DEFAULT_KINDS = (
    "CONCURRENT_KERNEL",
    "MEMCPY",
    "MEMCPY2",
    "MEMSET",
    "RUNTIME",
    "DRIVER",
    "SYNCHRONIZATION",
    "OVERHEAD",
    "EXTERNAL_CORRELATION",
)


class Kernel(NamedTuple):
    name: str
    start: int
    end: int
    queued: int
    device: int
    context: int
    stream: int
    correlation: int
    registers: int
    shared_memory: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    graph_id: int
    graph_node_id: int
    channel: int
    channel_type: int


class Memcpy(NamedTuple):
    copy_kind: int
    src_kind: int
    dst_kind: int
    bytes: int
    start: int
    end: int
    device: int
    context: int
    stream: int
    correlation: int
    src_device: int
    dst_device: int


class Memset(NamedTuple):
    bytes: int
    memory_kind: int
    start: int
    end: int
    device: int
    context: int
    stream: int
    correlation: int


class Api(NamedTuple):
    cbid: int
    start: int
    end: int
    thread: int
    correlation: int


class Sync(NamedTuple):
    type: int
    start: int
    end: int
    context: int
    stream: int
    correlation: int
    cuda_event: int


class Overhead(NamedTuple):
    overhead_kind: int
    start: int
    end: int
    object_kind: int


class External(NamedTuple):
    external_kind: int
    external_id: int
    correlation: int


def _get(r: Any, name: str, default: int = 0) -> Any:
    return getattr(r, name, default)


def _kernel(r: Any) -> Kernel:
    return Kernel(
        r.name,
        r.start,
        r.end,
        _get(r, "queued"),
        r.device_id,
        r.context_id,
        r.stream_id,
        r.correlation_id,
        r.registers_per_thread,
        r.static_shared_memory + r.dynamic_shared_memory,
        (r.grid_x, r.grid_y, r.grid_z),
        (r.block_x, r.block_y, r.block_z),
        _get(r, "graph_id"),
        _get(r, "graph_node_id"),
        _get(r, "channel_id"),
        _get(r, "channel_type"),
    )


def _memcpy(r: Any) -> Memcpy:
    return Memcpy(
        r.copy_kind,
        r.src_kind,
        r.dst_kind,
        r.bytes,
        r.start,
        r.end,
        r.device_id,
        r.context_id,
        r.stream_id,
        r.correlation_id,
        r.device_id,
        r.device_id,
    )


def _memcpy_p2p(r: Any) -> Memcpy:
    """A peer copy: a copy whose source and destination devices are its own."""
    return _memcpy(r)._replace(src_device=_get(r, "src_device_id"), dst_device=_get(r, "dst_device_id"))


def _memset(r: Any) -> Memset:
    return Memset(
        r.bytes, r.memory_kind, r.start, r.end, r.device_id, r.context_id, r.stream_id, r.correlation_id
    )


def _api(r: Any) -> Api:
    return Api(r.cbid, r.start, r.end, r.thread_id, r.correlation_id)


def _sync(r: Any) -> Sync:
    return Sync(r.type, r.start, r.end, r.context_id, r.stream_id, r.correlation_id, _get(r, "cuda_event_id"))


def _overhead(r: Any) -> Overhead:
    return Overhead(r.overhead_kind, r.start, r.end, _get(r, "object_kind"))


def _external(r: Any) -> External:
    return External(r.external_kind, r.external_id, r.correlation_id)


EXTRACTORS: dict[str, Callable[[Any], tuple]] = {
    KERNEL: _kernel,
    MEMCPY: _memcpy,
    MEMCPY_P2P: _memcpy_p2p,
    MEMSET: _memset,
    RUNTIME: _api,
    DRIVER: _api,
    SYNC: _sync,
    OVERHEAD: _overhead,
    EXTERNAL: _external,
}
