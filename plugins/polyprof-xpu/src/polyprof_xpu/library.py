"""Finding, loading and calling ``libpti_view`` (and explaining why it cannot work, when it cannot)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from typing import Any

from polyprof_xpu import abi

ENV_LIBRARY = "POLYPROF_PTI_LIBRARY"
INSTALL_HINT = (
    "install PyTorch's XPU build (it brings intel-pti) or `pip install 'polyprof-xpu[pti]'`, "
    f"or point {ENV_LIBRARY} at libpti_view.so"
)


class PtiUnavailable(RuntimeError):
    """PTI cannot trace here; the message says why and what to do."""


def candidate_paths() -> list[str]:
    paths = []
    if os.environ.get(ENV_LIBRARY):
        paths.append(os.environ[ENV_LIBRARY])
    for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):
        for name in ("libpti_view.so.1", "libpti_view.so"):
            paths.append(os.path.join(prefix, "lib", name))
    found = ctypes.util.find_library("pti_view")
    if found:
        paths.append(found)
    return paths


class PtiLibrary:
    """One loaded libpti_view with typed functions. Use :func:`load`, which caches per path."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise PtiUnavailable(f"{path} could not be loaded: {exc}") from exc
        missing = []
        for name, (restype, argtypes, required) in abi.PROTOTYPES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                if required:
                    missing.append(name)
                continue
            fn.restype, fn.argtypes = restype, argtypes
        if missing:
            raise PtiUnavailable(f"{path} is not a PTI View library: it lacks {', '.join(missing)}")
        v = self.lib.ptiVersion()
        self.version = (int(v._major), int(v._minor), int(v._patch))
        self.v2 = abi.uses_v2(self.version)
        self.layouts = abi.layouts(self.v2)
        self._callbacks: tuple | None = None  # keep the CFUNCTYPE objects alive while PTI holds them

    @property
    def version_string(self) -> str:
        return ".".join(map(str, self.version))

    def error(self, code: int) -> str:
        text = self.lib.ptiResultTypeToString(code)
        return text.decode() if text else f"PTI error {code}"

    def check(self, code: int, what: str) -> None:
        if code not in (abi.PTI_SUCCESS,):
            raise PtiUnavailable(f"{what} failed: {self.error(code)}")

    def why_not_implemented(self) -> str:
        """What is behind PTI_ERROR_NOT_IMPLEMENTED: usually libpti.so could not load the GPU stack."""
        impl = os.path.join(os.path.dirname(os.path.realpath(self.path)), "pti", "libpti.so")
        if os.path.exists(impl):
            try:
                ctypes.CDLL(impl)
            except OSError as exc:
                text = str(exc)
                if "ze_loader" in text:
                    return (
                        f"the Level Zero loader is missing ({text}): install the Intel GPU driver and "
                        "level-zero (e.g. apt install libze1 intel-level-zero-gpu)"
                    )
                if "xptifw" in text:
                    return (
                        f"the oneAPI runtime is missing ({text}): install dpcpp-cpp-rt or PyTorch's XPU build"
                    )
                return f"PTI's implementation library could not load: {text}"
        return "no Intel GPU with a Level Zero driver was found"

    def gpu_local_available(self) -> None:
        code = self.lib.ptiViewGPULocalAvailable()
        if code == abi.PTI_SUCCESS:
            return
        if code == abi.PTI_ERROR_NOT_IMPLEMENTED:
            raise PtiUnavailable(
                f"PTI {self.version_string} says {self.error(code)}: {self.why_not_implemented()}"
            )
        if code in (abi.PTI_ERROR_TRACING_NOT_INITIALIZED, abi.PTI_ERROR_L0_LOCAL_PROFILING_NOT_SUPPORTED):
            raise PtiUnavailable(
                f"PTI {self.version_string} says {self.error(code)}: this driver needs ZE_ENABLE_TRACING_LAYER=1 "
                "set before the program starts (LTS drivers), e.g. ZE_ENABLE_TRACING_LAYER=1 polyprof run ..."
            )
        raise PtiUnavailable(
            f"PTI {self.version_string}: ptiViewGPULocalAvailable returned {self.error(code)}"
        )

    def set_callbacks(self, requested: Any, completed: Any) -> None:
        req, comp = abi.BufferRequested(requested), abi.BufferCompleted(completed)
        self.check(self.lib.ptiViewSetCallbacks(req, comp), "ptiViewSetCallbacks")
        self._callbacks = (req, comp)

    def enable(self, kind: int) -> None:
        self.check(self.lib.ptiViewEnable(kind), f"ptiViewEnable({kind})")

    def disable(self, kind: int) -> None:
        self.lib.ptiViewDisable(kind)

    def flush(self) -> None:
        self.lib.ptiFlushAllViews()

    def timestamp(self) -> int:
        return int(self.lib.ptiViewGetTimestamp())

    def push(self, kind: int, ident: int) -> None:
        self.lib.ptiViewPushExternalCorrelationId(kind, ident)

    def pop(self, kind: int) -> None:
        out = ctypes.c_uint64()
        self.lib.ptiViewPopExternalCorrelationId(kind, ctypes.byref(out))

    def api_name(self, group: int, api_id: int) -> str:
        fn = getattr(self.lib, "ptiViewGetApiIdName", None)
        if fn is not None:
            name = ctypes.c_char_p()
            if fn(group, api_id, ctypes.byref(name)) == abi.PTI_SUCCESS and name.value:
                return name.value.decode(errors="replace")
        return f"api_{group}_{api_id}"

    def work_submitting_runtime_only(self) -> None:
        fn = getattr(self.lib, "ptiViewEnableRuntimeApiClass", None)
        if fn is not None:
            fn(1, abi.API_CLASS_GPU_OPERATION_CORE, abi.API_GROUP_ALL)

    def records(self, buffer: Any, used: int):
        """Yield (view kind, record structure) for each record in a completed buffer."""
        rec = ctypes.POINTER(abi.RecordBase)()
        get_next = self.lib.ptiViewGetNextRecord
        while True:
            code = get_next(buffer, used, ctypes.byref(rec))
            if code != abi.PTI_SUCCESS or not rec:
                return
            kind = rec.contents._view_kind
            layout = self.layouts.get(kind)
            if layout is not None:
                yield kind, ctypes.cast(rec, ctypes.POINTER(layout)).contents


_loaded: dict[str, PtiLibrary] = {}
_lock = threading.Lock()


def load() -> PtiLibrary:
    """The first PTI library that loads, from POLYPROF_PTI_LIBRARY, the intel-pti wheel, or the system."""
    problems = []
    with _lock:
        for path in candidate_paths():
            if path in _loaded:
                return _loaded[path]
            if os.path.sep in path and not os.path.exists(path):
                if path == os.environ.get(ENV_LIBRARY):
                    problems.append(f"{ENV_LIBRARY}={path} does not exist")
                continue
            try:
                lib = _loaded[path] = PtiLibrary(path)
                return lib
            except PtiUnavailable as exc:
                problems.append(str(exc))
    detail = "; ".join(problems) if problems else "libpti_view.so was not found"
    raise PtiUnavailable(f"{detail}: {INSTALL_HINT}")


def sycl_already_loaded() -> bool:
    """Whether the SYCL runtime was loaded before PTI (then SYCL-level records are missing)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libsycl.so" in line for line in f)
    except OSError:
        return False
