"""rocprofiler-sdk's C interface as ctypes: the enumerators, records and entry points polyprof-rocm uses.

Transcribed from the SDK's public headers (``rocprofiler-sdk/{fwd,buffer_tracing,callback_tracing,
registration,buffer,context,agent,external_correlation,rocprofiler}.h``, the 1.x series). Every record
the SDK hands over starts with its own ``size``; the session reads a record only when that size is at
least the size transcribed here, so a newer SDK that grew a record (fields are appended) is read, and
an unknown layout is counted and dropped, never misread. Tests compare these sizes with a compiled
double that declares the same structs in C.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_int,
    c_int32,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)

STATUS_SUCCESS = 0

#: the SDK versions whose layouts these are (major, minor) and newer minors of the same major
MIN_VERSION = (0, 5)
MAX_MAJOR = 1

# rocprofiler_buffer_category_t
BUFFER_CATEGORY_TRACING = 1

# rocprofiler_buffer_tracing_kind_t
BUFFER_TRACING_HSA_CORE_API = 1
BUFFER_TRACING_HSA_AMD_EXT_API = 2
BUFFER_TRACING_HIP_RUNTIME_API = 5
BUFFER_TRACING_MARKER_CORE_API = 7
BUFFER_TRACING_MEMORY_COPY = 10
BUFFER_TRACING_KERNEL_DISPATCH = 11

# rocprofiler_callback_tracing_kind_t
CALLBACK_TRACING_CODE_OBJECT = 10

# rocprofiler_code_object_operation_t, rocprofiler_callback_phase_t
CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER = 2
CALLBACK_PHASE_LOAD = 1

# rocprofiler_memory_copy_operation_t: Kineto's names for the directions
MEMORY_COPY_NAMES = {1: "HtoH", 2: "HtoD", 3: "DtoH", 4: "DtoD"}

# rocprofiler_buffer_policy_t, rocprofiler_agent_type_t, rocprofiler_agent_version_t
BUFFER_POLICY_LOSSLESS = 2
AGENT_TYPE_GPU = 2
AGENT_INFO_VERSION_0 = 1


class Handle(Structure):
    """rocprofiler_{context,buffer,agent,queue}_id_t: one opaque uint64."""

    _fields_ = [("handle", c_uint64)]


class UserData(Union):
    _fields_ = [("value", c_uint64), ("ptr", c_void_p)]


class CorrelationId(Structure):
    _fields_ = [("internal", c_uint64), ("external", UserData)]


class RecordHeader(Structure):
    """rocprofiler_record_header_t: (category, kind) as the low and high halves of one uint64."""

    _fields_ = [("category", c_uint32), ("kind", c_uint32), ("payload", c_void_p)]


class Dim3(Structure):
    _fields_ = [("x", c_uint32), ("y", c_uint32), ("z", c_uint32)]


class KernelDispatchInfo(Structure):
    _fields_ = [
        ("size", c_uint64),
        ("agent_id", Handle),
        ("queue_id", Handle),
        ("kernel_id", c_uint64),
        ("dispatch_id", c_uint64),
        ("private_segment_size", c_uint32),
        ("group_segment_size", c_uint32),
        ("workgroup_size", Dim3),
        ("grid_size", Dim3),
        ("reserved_padding", c_uint8 * 56),
    ]


class ApiRecord(Structure):
    """rocprofiler_buffer_tracing_{hip,hsa,marker}_api_record_t (one layout)."""

    _fields_ = [
        ("size", c_uint64),
        ("kind", c_int32),
        ("operation", c_int32),
        ("correlation_id", CorrelationId),
        ("start_timestamp", c_uint64),
        ("end_timestamp", c_uint64),
        ("thread_id", c_uint64),
    ]


class MemoryCopyRecord(Structure):
    _fields_ = [
        ("size", c_uint64),
        ("kind", c_int32),
        ("operation", c_int32),
        ("correlation_id", CorrelationId),
        ("thread_id", c_uint64),
        ("start_timestamp", c_uint64),
        ("end_timestamp", c_uint64),
        ("dst_agent_id", Handle),
        ("src_agent_id", Handle),
        ("bytes", c_uint64),
    ]


class KernelDispatchRecord(Structure):
    _fields_ = [
        ("size", c_uint64),
        ("kind", c_int32),
        ("operation", c_int32),
        ("correlation_id", CorrelationId),
        ("thread_id", c_uint64),
        ("start_timestamp", c_uint64),
        ("end_timestamp", c_uint64),
        ("dispatch_info", KernelDispatchInfo),
    ]


class CallbackRecord(Structure):
    """rocprofiler_callback_tracing_record_t (passed by value to callback tracing callbacks)."""

    _fields_ = [
        ("context_id", Handle),
        ("thread_id", c_uint64),
        ("correlation_id", CorrelationId),
        ("kind", c_int32),
        ("operation", c_int32),
        ("phase", c_int32),
        ("payload", c_void_p),
    ]


class KernelSymbolRegister(Structure):
    """rocprofiler_callback_tracing_code_object_kernel_symbol_register_data_t."""

    _fields_ = [
        ("size", c_uint64),
        ("kernel_id", c_uint64),
        ("code_object_id", c_uint64),
        ("kernel_name", c_char_p),
        ("kernel_object", c_uint64),
        ("kernarg_segment_size", c_uint32),
        ("kernarg_segment_alignment", c_uint32),
        ("group_segment_size", c_uint32),
        ("private_segment_size", c_uint32),
        ("sgpr_count", c_uint32),
        ("arch_vgpr_count", c_uint32),
        ("accum_vgpr_count", c_uint32),
    ]


class Agent(Structure):
    """rocprofiler_agent_v0_t up to its logical node ids (the fields after are not read)."""

    _fields_ = [
        ("size", c_uint64),
        ("id", Handle),
        ("type", c_int32),
        *((name, c_uint32) for name in (
            "cpu_cores_count", "simd_count", "mem_banks_count", "caches_count", "io_links_count",
            "cpu_core_id_base", "simd_id_base", "max_waves_per_simd", "lds_size_in_kb", "gds_size_in_kb",
            "num_gws", "wave_front_size", "num_xcc", "cu_count", "array_count", "num_shader_banks",
            "simd_arrays_per_engine", "cu_per_simd_array", "simd_per_cu", "max_slots_scratch_cu",
            "gfx_target_version",
        )),
        ("vendor_id", c_uint16),
        ("device_id", c_uint16),
        *((name, c_uint32) for name in (
            "location_id", "domain", "drm_render_minor", "num_sdma_engines", "num_sdma_xgmi_engines",
            "num_sdma_queues_per_engine", "num_cp_queues", "max_engine_clk_ccompute", "max_engine_clk_fcompute",
            "sdma_fw_version", "fw_version", "capability", "cu_per_engine", "max_waves_per_cu", "family_id",
            "workgroup_max_size", "grid_max_size",
        )),
        ("local_mem_size", c_uint64),
        ("hive_id", c_uint64),
        ("gpu_id", c_uint64),
        ("workgroup_max_dim", Dim3),
        ("grid_max_dim", Dim3),
        ("mem_banks", c_void_p),
        ("caches", c_void_p),
        ("io_links", c_void_p),
        ("name", c_char_p),
        ("vendor_name", c_char_p),
        ("product_name", c_char_p),
        ("model_name", c_char_p),
        ("node_id", c_uint32),
        ("logical_node_id", c_int32),
        ("logical_node_type_id", c_int32),
        ("reserved_padding0", c_int32),
    ]


class ClientId(Structure):
    _fields_ = [("name", c_char_p), ("handle", c_uint32)]


ClientFinalize = ctypes.CFUNCTYPE(None, ClientId)
ToolInitialize = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)
ToolFinalize = ctypes.CFUNCTYPE(None, c_void_p)


class ToolConfigureResult(Structure):
    _fields_ = [("size", c_size_t), ("initialize", ToolInitialize), ("finalize", ToolFinalize), ("tool_data", c_void_p)]


# returns a rocprofiler_tool_configure_result_t* (as an address: ctypes callbacks return simple types only)
ConfigureFunc = ctypes.CFUNCTYPE(c_void_p, c_uint32, c_char_p, c_uint32, POINTER(ClientId))
BufferCallback = ctypes.CFUNCTYPE(None, Handle, Handle, POINTER(POINTER(RecordHeader)), c_size_t, c_void_p, c_uint64)
TracingCallback = ctypes.CFUNCTYPE(None, CallbackRecord, POINTER(UserData), c_void_p)
AgentsCallback = ctypes.CFUNCTYPE(c_int, c_int, POINTER(c_void_p), c_size_t, c_void_p)

#: entry point -> (restype, argtypes)
PROTOTYPES = {
    "rocprofiler_get_version": (c_int, [POINTER(c_uint32)] * 3),
    "rocprofiler_get_status_string": (c_char_p, [c_int]),
    "rocprofiler_get_timestamp": (c_int, [POINTER(c_uint64)]),
    "rocprofiler_get_thread_id": (c_int, [POINTER(c_uint64)]),
    "rocprofiler_is_initialized": (c_int, [POINTER(c_int)]),
    "rocprofiler_force_configure": (c_int, [ConfigureFunc]),
    "rocprofiler_create_context": (c_int, [POINTER(Handle)]),
    "rocprofiler_start_context": (c_int, [Handle]),
    "rocprofiler_stop_context": (c_int, [Handle]),
    "rocprofiler_create_buffer": (c_int, [Handle, c_size_t, c_size_t, c_int, BufferCallback, c_void_p, POINTER(Handle)]),
    "rocprofiler_flush_buffer": (c_int, [Handle]),
    "rocprofiler_configure_buffer_tracing_service": (c_int, [Handle, c_int, POINTER(c_int32), c_size_t, Handle]),
    "rocprofiler_configure_callback_tracing_service": (c_int, [Handle, c_int, POINTER(c_int32), c_size_t, TracingCallback, c_void_p]),
    "rocprofiler_query_buffer_tracing_kind_operation_name": (c_int, [c_int, c_int32, POINTER(c_char_p), POINTER(c_uint64)]),
    "rocprofiler_query_available_agents": (c_int, [c_int, AgentsCallback, c_size_t, c_void_p]),
    "rocprofiler_push_external_correlation_id": (c_int, [Handle, c_uint64, UserData]),
    "rocprofiler_pop_external_correlation_id": (c_int, [Handle, c_uint64, POINTER(UserData)]),
}

#: record kind -> (its struct, the fields the session keeps, in order)
RECORDS = {
    BUFFER_TRACING_HIP_RUNTIME_API: ApiRecord,
    BUFFER_TRACING_HSA_CORE_API: ApiRecord,
    BUFFER_TRACING_HSA_AMD_EXT_API: ApiRecord,
    BUFFER_TRACING_MARKER_CORE_API: ApiRecord,
    BUFFER_TRACING_MEMORY_COPY: MemoryCopyRecord,
    BUFFER_TRACING_KERNEL_DISPATCH: KernelDispatchRecord,
}
