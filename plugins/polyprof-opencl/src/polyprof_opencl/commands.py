"""The pyopencl entry points this plugin times, what each one is on the timeline, and its byte count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyprof.plugin import ActivityKind

KERNEL, MEMCPY, MEMSET, MAP, UNMAP = "kernel", "memcpy", "memset", "map", "unmap"
#: device-side kind of each category (map/unmap are copies: HTA types device rows named Memcpy as memory)
DEVICE_KIND = {KERNEL: ActivityKind.KERNEL, MEMCPY: ActivityKind.GPU_MEMCPY, MEMSET: ActivityKind.GPU_MEMSET,
               MAP: ActivityKind.GPU_MEMCPY, UNMAP: ActivityKind.GPU_MEMCPY}
DEVICE_NAME = {"HtoD": "Memcpy HtoD (Host -> Device)", "DtoH": "Memcpy DtoH (Device -> Host)",
               "DtoD": "Memcpy DtoD (Device -> Device)", "SVM": "Memcpy SVM", "map": "Memcpy Map",
               "unmap": "Memcpy Unmap", MEMSET: "Memset (Fill)"}


@dataclass(frozen=True)
class CommandSpec:
    """One intercepted entry point of ``pyopencl._cl``: the OpenCL call it makes (the host-side runtime
    row's name), its category, a copy's direction, and how to read its byte count from the arguments."""

    attr: str
    category: str
    api: str
    direction: str = ""
    nbytes: Callable[[tuple, dict], int | None] | None = None

    def device_name(self) -> str:
        return DEVICE_NAME.get(self.direction or self.category, "Memcpy")


def arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    return kwargs[name] if name in kwargs else (args[pos] if len(args) > pos else default)


def _host_bytes(obj: Any) -> int | None:
    nbytes = getattr(obj, "nbytes", None)  # numpy arrays: the common case, answered without a call
    if type(nbytes) is int:
        return nbytes
    try:
        return memoryview(obj).nbytes
    except TypeError:
        return None


def hostbuf_bytes(args: tuple, kwargs: dict) -> int | None:
    return _host_bytes(arg(args, kwargs, 2, "hostbuf"))


def _copy_bytes(args: tuple, kwargs: dict) -> int | None:
    count = arg(args, kwargs, 3, "byte_count", -1)
    if isinstance(count, int) and count >= 0:
        return count
    src, dst = arg(args, kwargs, 1, "src"), arg(args, kwargs, 2, "dst")
    return min(int(src.size) - int(arg(args, kwargs, 4, "src_offset", 0)),
               int(dst.size) - int(arg(args, kwargs, 5, "dst_offset", 0)))


def _region_bytes(args: tuple, kwargs: dict) -> int | None:
    total = 1
    for r in arg(args, kwargs, 5, "region"):
        total *= int(r)
    return total


def _map_bytes(args: tuple, kwargs: dict) -> int | None:
    import numpy as np

    return int(np.prod(arg(args, kwargs, 4, "shape"))) * np.dtype(arg(args, kwargs, 5, "dtype")).itemsize


def nbytes_of(spec: CommandSpec, args: tuple, kwargs: dict) -> int | None:
    try:
        value = spec.nbytes(args, kwargs) if spec.nbytes is not None else None
    except Exception:  # an argument the helper did not expect: no byte count, never an error
        return None
    return value if type(value) is int else None


_S = CommandSpec
COMMANDS: tuple[CommandSpec, ...] = (
    _S("enqueue_nd_range_kernel", KERNEL, "clEnqueueNDRangeKernel"),
    _S("_enqueue_read_buffer", MEMCPY, "clEnqueueReadBuffer", "DtoH", hostbuf_bytes),
    _S("_enqueue_write_buffer", MEMCPY, "clEnqueueWriteBuffer", "HtoD", hostbuf_bytes),
    _S("_enqueue_copy_buffer", MEMCPY, "clEnqueueCopyBuffer", "DtoD", _copy_bytes),
    _S("_enqueue_read_buffer_rect", MEMCPY, "clEnqueueReadBufferRect", "DtoH", _region_bytes),
    _S("_enqueue_write_buffer_rect", MEMCPY, "clEnqueueWriteBufferRect", "HtoD", _region_bytes),
    _S("_enqueue_copy_buffer_rect", MEMCPY, "clEnqueueCopyBufferRect", "DtoD", _region_bytes),
    _S("_enqueue_read_image", MEMCPY, "clEnqueueReadImage", "DtoH"),
    _S("_enqueue_write_image", MEMCPY, "clEnqueueWriteImage", "HtoD"),
    _S("_enqueue_copy_image", MEMCPY, "clEnqueueCopyImage", "DtoD"),
    _S("_enqueue_copy_image_to_buffer", MEMCPY, "clEnqueueCopyImageToBuffer", "DtoD"),
    _S("_enqueue_copy_buffer_to_image", MEMCPY, "clEnqueueCopyBufferToImage", "DtoD"),
    _S("_enqueue_svm_memcpy", MEMCPY, "clEnqueueSVMMemcpy", "SVM", lambda a, k: _host_bytes(arg(a, k, 3, "src"))),
    _S("_enqueue_fill_buffer", MEMSET, "clEnqueueFillBuffer", "", lambda a, k: arg(a, k, 4, "size")),
    _S("enqueue_fill_image", MEMSET, "clEnqueueFillImage"),
    _S("_enqueue_svm_memfill", MEMSET, "clEnqueueSVMMemFill"),
    _S("enqueue_map_buffer", MAP, "clEnqueueMapBuffer", "map", _map_bytes),
    _S("enqueue_map_image", MAP, "clEnqueueMapImage", "map"),
    _S("_enqueue_svm_map", MAP, "clEnqueueSVMMap", "map"),
    _S("_enqueue_svm_unmap", UNMAP, "clEnqueueSVMUnmap", "unmap"),
)
UNMAP_SPEC = _S("MemoryMap.release", UNMAP, "clEnqueueUnmapMemObject", "unmap")
