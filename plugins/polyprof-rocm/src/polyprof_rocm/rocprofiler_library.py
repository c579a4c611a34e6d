"""Finding and loading ``librocprofiler-sdk.so``, and polyprof's one registration as a rocprofiler tool.

rocprofiler-sdk is configured once per process: a tool registers (here with
``rocprofiler_force_configure``, at the first profile that asks for the ``rocm`` backend), creates its
contexts and buffers inside its ``initialize`` callback, and only starts and stops them afterwards.
So the :class:`Tool` is process-wide: one context with the buffer tracing services (started and stopped
by each profile) and one with code-object callbacks, started at once and left running, so that every
kernel's name is known whenever it was loaded. ctypes, not a compiled shim: nothing to build on the
user's machine, and every layout is checked against each record's own ``size`` (rocprofiler_abi.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from typing import Any

from polyprof_rocm import rocprofiler_abi as abi

ENV_LIBRARY = "POLYPROF_ROCPROFILER_LIBRARY"
INSTALL_HINT = (
    "install ROCm 6.2 or newer with rocprofiler-sdk (e.g. apt install rocprofiler-sdk), set ROCM_PATH, "
    f"or point {ENV_LIBRARY} at librocprofiler-sdk.so"
)
BUFFER_BYTES = 8 << 20
WATERMARK_BYTES = 6 << 20


class RocprofilerUnavailable(RuntimeError):
    """rocprofiler-sdk cannot trace here; the message says why and what to do."""


def candidate_paths() -> list[str]:
    paths = []
    if os.environ.get(ENV_LIBRARY):
        paths.append(os.environ[ENV_LIBRARY])
    for root in dict.fromkeys(filter(None, [os.environ.get("ROCM_PATH"), "/opt/rocm"])):
        for name in ("librocprofiler-sdk.so.1", "librocprofiler-sdk.so", "librocprofiler-sdk.so.0"):
            paths.append(os.path.join(root, "lib", name))
    found = ctypes.util.find_library("rocprofiler-sdk")
    if found:
        paths.append(found)
    return paths


class Library:
    """One loaded librocprofiler-sdk with typed entry points. Use :func:`load` (cached per path)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise RocprofilerUnavailable(f"{path} could not be loaded: {exc}") from exc
        missing = [name for name in abi.PROTOTYPES if getattr(self.lib, name, None) is None]
        if missing:
            raise RocprofilerUnavailable(f"{path} is not rocprofiler-sdk: it lacks {', '.join(missing)}")
        for name, (restype, argtypes) in abi.PROTOTYPES.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        parts = [ctypes.c_uint32() for _ in range(3)]
        self.check(self.lib.rocprofiler_get_version(*map(ctypes.byref, parts)), "rocprofiler_get_version")
        self.version = tuple(int(p.value) for p in parts)
        if self.version[:2] < abi.MIN_VERSION or self.version[0] > abi.MAX_MAJOR:
            raise RocprofilerUnavailable(
                f"rocprofiler-sdk {self.version_string} at {path}: polyprof-rocm reads the record layouts of "
                f"{abi.MIN_VERSION[0]}.{abi.MIN_VERSION[1]} to {abi.MAX_MAJOR}.x; {INSTALL_HINT}"
            )

    @property
    def version_string(self) -> str:
        return ".".join(map(str, self.version))

    def error(self, code: int) -> str:
        text = self.lib.rocprofiler_get_status_string(code)
        return text.decode(errors="replace") if text else f"rocprofiler status {code}"

    def check(self, code: int, what: str) -> None:
        if code != abi.STATUS_SUCCESS:
            raise RocprofilerUnavailable(f"{what} failed: {self.error(code)}")

    def timestamp(self) -> int:
        ts = ctypes.c_uint64()
        self.check(self.lib.rocprofiler_get_timestamp(ctypes.byref(ts)), "rocprofiler_get_timestamp")
        return int(ts.value)

    def thread_id(self) -> int:
        tid = ctypes.c_uint64()
        self.check(self.lib.rocprofiler_get_thread_id(ctypes.byref(tid)), "rocprofiler_get_thread_id")
        return int(tid.value)

    def gpu_agents(self) -> list[dict[str, Any]]:
        """The GPU agents rocprofiler-sdk sees: id, name, product, node ids, compute units, wavefront."""
        found: list[dict[str, Any]] = []

        def each(version: int, agents: Any, count: int, data: Any) -> int:
            try:
                for i in range(count):
                    a = ctypes.cast(agents[i], ctypes.POINTER(abi.Agent)).contents
                    if a.type != abi.AGENT_TYPE_GPU:
                        continue
                    found.append({
                        "id": int(a.id.handle), "name": _text(a.name), "product": _text(a.product_name),
                        "model": _text(a.model_name), "node_id": int(a.node_id),
                        "logical_node_id": int(a.logical_node_id), "cu_count": int(a.cu_count),
                        "wave_front_size": int(a.wave_front_size), "gfx_target_version": int(a.gfx_target_version),
                        "logical_node_type_id": int(a.logical_node_type_id),
                        "device_id": int(a.device_id), "local_mem_size": int(a.local_mem_size),
                    })
            except Exception:  # noqa: BLE001 - never into C; what was read is kept
                pass
            return abi.STATUS_SUCCESS

        callback = abi.AgentsCallback(each)
        self.check(
            self.lib.rocprofiler_query_available_agents(
                abi.AGENT_INFO_VERSION_0, callback, ctypes.sizeof(abi.Agent), None
            ),
            "rocprofiler_query_available_agents",
        )
        return sorted(found, key=lambda a: (a["logical_node_id"], a["node_id"]))

    def operation_name(self, kind: int, operation: int) -> str:
        name, size = ctypes.c_char_p(), ctypes.c_uint64()
        code = self.lib.rocprofiler_query_buffer_tracing_kind_operation_name(kind, operation, ctypes.byref(name), ctypes.byref(size))
        if code != abi.STATUS_SUCCESS or not name.value:
            return f"operation {operation}"
        return name.value[: size.value or None].decode(errors="replace")


def _text(value: bytes | None) -> str:
    return value.decode(errors="replace") if value else ""


_loaded: dict[str, Library] = {}
_load_lock = threading.Lock()


def load() -> Library:
    """The first candidate that loads, or RocprofilerUnavailable with every reason."""
    problems, looked = [], []
    with _load_lock:
        for path in candidate_paths():
            if path in _loaded:
                return _loaded[path]
            if os.path.sep in path and not os.path.exists(path):
                folder = os.path.dirname(path)
                if folder not in looked:
                    looked.append(folder)
                continue
            try:
                lib = _loaded[path] = Library(path)
                return lib
            except RocprofilerUnavailable as exc:
                problems.append(str(exc))
    if looked:
        problems.insert(0, f"no librocprofiler-sdk.so in {', '.join(looked)}")
    detail = "; ".join(problems) if problems else "no candidate path"
    raise RocprofilerUnavailable(f"rocprofiler-sdk not found ({detail}): {INSTALL_HINT}")


RecordSink = Callable[[int, Any], None]


class Tool:
    """polyprof's registration with rocprofiler-sdk (one per process; see the module docstring).

    ``on_record(kind, record)`` gets each buffered record (its struct, valid during the call) on the
    SDK's thread; ``kernel_names`` maps kernel ids to names as code objects load."""

    def __init__(self, lib: Library, kinds: tuple[int, ...]) -> None:
        self.lib = lib
        self.kinds = kinds
        self.trace_ctx = abi.Handle()
        self.names_ctx = abi.Handle()
        self.buffer = abi.Handle()
        self.kernel_names: dict[int, str] = {}
        self.on_record: RecordSink | None = None
        self.callback_errors: list[str] = []
        self.dropped_by_sdk = 0
        self.configured_kinds: list[int] = []
        self.init_problem = ""
        self._tids = threading.local()  # rocprofiler's id of each thread that pushes ids
        # the C callbacks, kept alive for the process's life (the SDK holds them)
        self._configure = abi.ConfigureFunc(self._configure_cb)
        self._result = abi.ToolConfigureResult(
            ctypes.sizeof(abi.ToolConfigureResult), abi.ToolInitialize(self._initialize), abi.ToolFinalize(lambda data: None), None
        )
        self._buffer_cb = abi.BufferCallback(self._buffered)
        self._names_cb = abi.TracingCallback(self._code_object)
        code = lib.lib.rocprofiler_force_configure(self._configure)
        lib.check(code, "rocprofiler_force_configure")
        if self.init_problem:
            raise RocprofilerUnavailable(self.init_problem)

    # -- the SDK calls these ------------------------------------------------------------------------
    def _configure_cb(self, version: int, runtime_version: bytes, priority: int, client: Any) -> Any:
        try:
            client.contents.name = b"polyprof"
        except Exception:  # noqa: BLE001
            pass
        return ctypes.addressof(self._result)

    def _initialize(self, finalize: Any, tool_data: Any) -> int:
        try:
            lib, c = self.lib, self.lib.lib
            lib.check(c.rocprofiler_create_context(ctypes.byref(self.names_ctx)), "rocprofiler_create_context")
            ops = (ctypes.c_int32 * 1)(abi.CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER)
            lib.check(
                c.rocprofiler_configure_callback_tracing_service(self.names_ctx, abi.CALLBACK_TRACING_CODE_OBJECT, ops, 1, self._names_cb, None),
                "rocprofiler_configure_callback_tracing_service(code objects)",
            )
            lib.check(c.rocprofiler_create_context(ctypes.byref(self.trace_ctx)), "rocprofiler_create_context")
            lib.check(
                c.rocprofiler_create_buffer(self.trace_ctx, BUFFER_BYTES, WATERMARK_BYTES, abi.BUFFER_POLICY_LOSSLESS,
                                            self._buffer_cb, None, ctypes.byref(self.buffer)),
                "rocprofiler_create_buffer",
            )
            for kind in self.kinds:
                code = c.rocprofiler_configure_buffer_tracing_service(self.trace_ctx, kind, None, 0, self.buffer)
                if code == abi.STATUS_SUCCESS:
                    self.configured_kinds.append(kind)
                else:
                    self.callback_errors.append(f"tracing service {kind}: {lib.error(code)}")
            lib.check(c.rocprofiler_start_context(self.names_ctx), "rocprofiler_start_context(code objects)")
        except Exception as exc:  # noqa: BLE001 - never into C; the constructor raises it
            self.init_problem = f"rocprofiler-sdk tool initialisation: {exc}"
            return 1
        return 0

    def _code_object(self, record: Any, user_data: Any, data: Any) -> None:
        try:
            if record.kind == abi.CALLBACK_TRACING_CODE_OBJECT and record.operation == abi.CODE_OBJECT_DEVICE_KERNEL_SYMBOL_REGISTER and record.phase == abi.CALLBACK_PHASE_LOAD:
                sym = ctypes.cast(record.payload, ctypes.POINTER(abi.KernelSymbolRegister)).contents
                self.kernel_names[int(sym.kernel_id)] = _text(sym.kernel_name)
        except Exception as exc:  # noqa: BLE001
            self._note(exc)

    def _buffered(self, context: Any, buffer: Any, headers: Any, count: int, data: Any, drops: int) -> None:
        try:
            self.dropped_by_sdk += int(drops)
            sink = self.on_record
            for i in range(count):
                header = headers[i].contents
                if header.category != abi.BUFFER_CATEGORY_TRACING or sink is None:
                    continue
                sink(int(header.kind), header.payload)
        except Exception as exc:  # noqa: BLE001 - never into C
            self._note(exc)

    def _note(self, exc: BaseException) -> None:
        if len(self.callback_errors) < 10:
            self.callback_errors.append(f"{type(exc).__name__}: {exc}")

    # -- profiles ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.lib.check(self.lib.lib.rocprofiler_start_context(self.trace_ctx), "rocprofiler_start_context")

    def stop(self) -> None:
        self.lib.check(self.lib.lib.rocprofiler_stop_context(self.trace_ctx), "rocprofiler_stop_context")
        self.flush()

    def flush(self) -> None:
        self.lib.check(self.lib.lib.rocprofiler_flush_buffer(self.buffer), "rocprofiler_flush_buffer")

    def push(self, ident: int) -> None:
        """Make `ident` the External id of what this thread launches next (a host op or annotation)."""
        self.lib.lib.rocprofiler_push_external_correlation_id(self.trace_ctx, self._thread(), abi.UserData(value=ident))

    def pop(self) -> None:
        out = abi.UserData()
        self.lib.lib.rocprofiler_pop_external_correlation_id(self.trace_ctx, self._thread(), ctypes.byref(out))

    def _thread(self) -> int:
        tid = getattr(self._tids, "tid", None)
        if tid is None:
            tid = self._tids.tid = self.lib.thread_id()
        return tid


_tool: Tool | None = None
_tool_lock = threading.Lock()


def tool(kinds: tuple[int, ...]) -> Tool:
    """The process's Tool, registered at the first call with `kinds` (later calls get the same one)."""
    global _tool
    with _tool_lock:
        if _tool is None:
            _tool = Tool(load(), kinds)
        return _tool
