"""PTI-sdk View API as ctypes: enums, record layouts (v1 and v2) and function prototypes.

Transcribed from the layouts documented in PTI-sdk's ``pti_view.h`` (1.x): every record starts with
the 32-bit view kind; a ``_v2`` record is its v1 record followed by device handle and engine fields,
and PTI >= 1.0 (or 0.18+) writes v2 records. All enums are 32-bit.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

# pti_result
PTI_SUCCESS = 0
PTI_STATUS_END_OF_BUFFER = 1
PTI_ERROR_NOT_IMPLEMENTED = 2
PTI_ERROR_TRACING_NOT_INITIALIZED = 51
PTI_ERROR_L0_LOCAL_PROFILING_NOT_SUPPORTED = 52

# pti_view_kind
VIEW_DEVICE_GPU_KERNEL = 1
VIEW_DEVICE_CPU_KERNEL = 2
VIEW_DRIVER_API = 3
VIEW_COLLECTION_OVERHEAD = 5
VIEW_RUNTIME_API = 6
VIEW_EXTERNAL_CORRELATION = 7
VIEW_DEVICE_GPU_MEM_COPY = 8
VIEW_DEVICE_GPU_MEM_FILL = 9
VIEW_DEVICE_GPU_MEM_COPY_P2P = 10
VIEW_DEVICE_SYNCHRONIZATION = 11
VIEW_COMMUNICATION = 12

# pti_view_external_kind
EXTERNAL_KIND_CUSTOM_0 = 2  # framework ops
EXTERNAL_KIND_CUSTOM_1 = 3  # user annotations

# pti_api_group_id / pti_api_class
API_GROUP_LEVELZERO, API_GROUP_OPENCL, API_GROUP_SYCL = 1, 2, 3
API_GROUP_ALL = 0x7FFFFFFF
API_CLASS_GPU_OPERATION_CORE = 1

MEMORY_TYPES = {0: "Memory", 1: "Host", 2: "Device", 3: "Shared"}
MEMCPY_TYPES = {
    i: name
    for i, name in enumerate(
        [
            "M2M",
            "M2H",
            "M2D",
            "M2S",
            "H2M",
            "H2H",
            "H2D",
            "H2S",
            "D2M",
            "D2H",
            "D2D",
            "D2S",
            "S2M",
            "S2H",
            "S2D",
            "S2S",
        ]
    )
}
SYNC_TYPES = {
    0: "Unknown",
    1: "GPU Barrier Execution",
    2: "GPU Barrier Memory",
    3: "Host Fence Sync",
    4: "Host Event Sync",
    5: "Host Command List Sync",
    6: "Host Command Queue Sync",
    7: "Host Device Sync",
}
OVERHEAD_KINDS = {
    0: "Invalid",
    1: "Unknown",
    2: "Resource",
    3: "Buffer Flush",
    4: "Driver",
    5: "Instrumentation",
}
INVALID_QUEUE_IDS = {0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFE}

UUID = c_uint8 * 16
PCI = c_char * 16


class Version(ctypes.Structure):
    _fields_ = [("_major", c_uint32), ("_minor", c_uint32), ("_patch", c_uint32)]


class RecordBase(ctypes.Structure):
    _fields_ = [("_view_kind", c_uint32)]


_TIMES = [
    ("_append_timestamp", c_uint64),
    ("_start_timestamp", c_uint64),
    ("_end_timestamp", c_uint64),
    ("_submit_timestamp", c_uint64),
]
_V2_TAIL = [("_device_handle", c_void_p), ("_engine_ordinal", c_uint32), ("_engine_index", c_uint32)]

KERNEL_V1 = [
    ("_view_kind", c_uint32),
    ("_queue_handle", c_void_p),
    ("_context_handle", c_void_p),
    ("_name", c_char_p),
    ("_source_file_name", c_char_p),
    ("_source_line_number", c_uint64),
    ("_kernel_id", c_uint64),
    ("_correlation_id", c_uint32),
    ("_thread_id", c_uint32),
    ("_pci_address", PCI),
    ("_device_uuid", UUID),
    *_TIMES,
    ("_sycl_task_begin_timestamp", c_uint64),
    ("_sycl_enqk_begin_timestamp", c_uint64),
    ("_sycl_node_id", c_uint64),
    ("_sycl_queue_id", c_uint64),
    ("_sycl_invocation_id", c_uint32),
]
MEMCPY_V1 = [
    ("_view_kind", c_uint32),
    ("_memcpy_type", c_uint32),
    ("_mem_src", c_uint32),
    ("_mem_dst", c_uint32),
    ("_queue_handle", c_void_p),
    ("_context_handle", c_void_p),
    ("_name", c_char_p),
    ("_pci_address", PCI),
    ("_device_uuid", UUID),
    ("_mem_op_id", c_uint64),
    ("_correlation_id", c_uint32),
    ("_thread_id", c_uint32),
    *_TIMES,
    ("_bytes", c_uint64),
    ("_sycl_queue_id", c_uint64),
]
MEMCPY_P2P_V1 = [
    ("_view_kind", c_uint32),
    ("_memcpy_type", c_uint32),
    ("_mem_src", c_uint32),
    ("_mem_dst", c_uint32),
    ("_queue_handle", c_void_p),
    ("_context_handle", c_void_p),
    ("_name", c_char_p),
    ("_src_pci_address", PCI),
    ("_dst_pci_address", PCI),
    ("_src_uuid", UUID),
    ("_dst_uuid", UUID),
    ("_mem_op_id", c_uint64),
    ("_correlation_id", c_uint32),
    ("_thread_id", c_uint32),
    *_TIMES,
    ("_bytes", c_uint64),
    ("_sycl_queue_id", c_uint64),
]
FILL_V1 = [
    ("_view_kind", c_uint32),
    ("_mem_type", c_uint32),
    ("_queue_handle", c_void_p),
    ("_context_handle", c_void_p),
    ("_name", c_char_p),
    ("_pci_address", PCI),
    ("_device_uuid", UUID),
    ("_mem_op_id", c_uint64),
    ("_correlation_id", c_uint32),
    ("_thread_id", c_uint32),
    *_TIMES,
    ("_bytes", c_uint64),
    ("_value_for_set", c_uint64),
    ("_sycl_queue_id", c_uint64),
]


def _struct(name: str, fields: list) -> type:
    return type(name, (ctypes.Structure,), {"_fields_": fields})


Kernel = _struct("Kernel", KERNEL_V1)
KernelV2 = _struct("KernelV2", KERNEL_V1 + _V2_TAIL)
Memcpy = _struct("Memcpy", MEMCPY_V1)
MemcpyV2 = _struct("MemcpyV2", MEMCPY_V1 + _V2_TAIL)
MemcpyP2P = _struct("MemcpyP2P", MEMCPY_P2P_V1)
MemcpyP2PV2 = _struct(
    "MemcpyP2PV2",
    MEMCPY_P2P_V1
    + [
        ("_src_device_handle", c_void_p),
        ("_dst_device_handle", c_void_p),
        ("_engine_ordinal", c_uint32),
        ("_engine_index", c_uint32),
    ],
)
Fill = _struct("Fill", FILL_V1)
FillV2 = _struct("FillV2", FILL_V1 + _V2_TAIL)
Synchronization = _struct(
    "Synchronization",
    [
        ("_view_kind", c_uint32),
        ("_synch_type", c_uint32),
        ("_context_handle", c_void_p),
        ("_queue_handle", c_void_p),
        ("_event_handle", c_void_p),
        ("_start_timestamp", c_uint64),
        ("_end_timestamp", c_uint64),
        ("_thread_id", c_uint32),
        ("_correlation_id", c_uint32),
        ("_number_wait_events", c_uint32),
        ("_return_code", c_uint32),
        ("_api_id", c_uint32),
        ("_api_group", c_uint32),
    ],
)
ExternalCorrelation = _struct(
    "ExternalCorrelation",
    [
        ("_view_kind", c_uint32),
        ("_correlation_id", c_uint32),
        ("_external_id", c_uint64),
        ("_external_kind", c_uint32),
    ],
)
Overhead = _struct(
    "Overhead",
    [
        ("_view_kind", c_uint32),
        ("_overhead_start_timestamp_ns", c_uint64),
        ("_overhead_end_timestamp_ns", c_uint64),
        ("_overhead_thread_id", c_uint32),
        ("_api_id", c_uint32),
        ("_overhead_count", c_uint64),
        ("_overhead_duration_ns", c_uint64),
        ("_overhead_kind", c_uint32),
    ],
)
Api = _struct(
    "Api",
    [
        ("_view_kind", c_uint32),
        ("_start_timestamp", c_uint64),
        ("_end_timestamp", c_uint64),
        ("_api_group", c_uint32),
        ("_api_id", c_uint32),
        ("_process_id", c_uint32),
        ("_thread_id", c_uint32),
        ("_correlation_id", c_uint32),
        ("_return_code", c_uint32),
    ],
)
Comms = _struct(
    "Comms",
    [
        ("_view_kind", c_uint32),
        ("_start_timestamp", c_uint64),
        ("_end_timestamp", c_uint64),
        ("_process_id", c_uint32),
        ("_thread_id", c_uint32),
        ("_send_size", c_uint64),
        ("_recv_size", c_uint64),
        ("_communicator_id", c_uint64),
        ("_name", c_char_p),
    ],
)


def layouts(v2: bool) -> dict[int, type]:
    """view kind -> record structure for the PTI version in use."""
    return {
        VIEW_DEVICE_GPU_KERNEL: KernelV2 if v2 else Kernel,
        VIEW_DEVICE_GPU_MEM_COPY: MemcpyV2 if v2 else Memcpy,
        VIEW_DEVICE_GPU_MEM_COPY_P2P: MemcpyP2PV2 if v2 else MemcpyP2P,
        VIEW_DEVICE_GPU_MEM_FILL: FillV2 if v2 else Fill,
        VIEW_DEVICE_SYNCHRONIZATION: Synchronization,
        VIEW_EXTERNAL_CORRELATION: ExternalCorrelation,
        VIEW_COLLECTION_OVERHEAD: Overhead,
        VIEW_RUNTIME_API: Api,
        VIEW_DRIVER_API: Api,
        VIEW_COMMUNICATION: Comms,
    }


def uses_v2(version: tuple[int, int, int]) -> bool:
    major, minor, _ = version
    return major >= 1 or (major == 0 and minor > 17)


BufferRequested = ctypes.CFUNCTYPE(None, POINTER(POINTER(c_uint8)), POINTER(c_size_t))
BufferCompleted = ctypes.CFUNCTYPE(None, POINTER(c_uint8), c_size_t, c_size_t)

#: name -> (restype, argtypes, required)
PROTOTYPES = {
    "ptiVersion": (Version, [], True),
    "ptiResultTypeToString": (c_char_p, [c_int], True),
    "ptiViewSetCallbacks": (c_int, [BufferRequested, BufferCompleted], True),
    "ptiViewEnable": (c_int, [c_uint32], True),
    "ptiViewDisable": (c_int, [c_uint32], True),
    "ptiViewGPULocalAvailable": (c_int, [], True),
    "ptiFlushAllViews": (c_int, [], True),
    "ptiViewGetNextRecord": (c_int, [POINTER(c_uint8), c_size_t, POINTER(POINTER(RecordBase))], True),
    "ptiViewPushExternalCorrelationId": (c_int, [c_uint32, c_uint64], True),
    "ptiViewPopExternalCorrelationId": (c_int, [c_uint32, POINTER(c_uint64)], True),
    "ptiViewGetTimestamp": (c_uint64, [], True),
    "ptiViewGetApiIdName": (c_int, [c_uint32, c_uint32, POINTER(c_char_p)], False),
    "ptiViewEnableRuntimeApiClass": (c_int, [c_uint32, c_uint32, c_uint32], False),
}
