"""The only module that calls cupti-python (and cuda-bindings for device facts).

Tests replace :class:`CuptiLayer` with a layer that replays recorded records; everything above this
module (session, mapping, clocks, flows) is the same code in both cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXTERNAL_KIND = {"op": "CUSTOM0", "annotation": "CUSTOM1"}


@dataclass
class DeviceFacts:
    index: int
    name: str
    properties: dict[str, Any] = field(default_factory=dict)


#: CUPTI errors (cupti.Result names) after which nothing can be traced in this process.
CANNOT_TRACE = {
    "ERROR_INSUFFICIENT_PRIVILEGES": "this user may not profile the GPU (run as root, or load the driver with "
    "NVreg_RestrictProfilingToAdminUsers=0)",
    "ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED": "the GPU is a virtual device that CUPTI does not support",
    "ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES": "the virtual GPU's profile does not allow profiling",
    "ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED": "the GPU runs in confidential-computing mode",
    "ERROR_CMP_DEVICE_NOT_SUPPORTED": "CUPTI does not support CMP devices",
    "ERROR_MIG_DEVICE_NOT_SUPPORTED": "CUPTI does not support this MIG configuration",
    "ERROR_SLI_DEVICE_NOT_SUPPORTED": "CUPTI does not support SLI devices",
    "ERROR_WSL_DEVICE_NOT_SUPPORTED": "CUPTI does not support this device under WSL",
    "ERROR_NOT_COMPATIBLE": "another profiling feature in this process is incompatible with tracing",
}


class CuptiUnavailable(RuntimeError):
    """CUPTI cannot be used here; the message says why and what to do."""


class SubscriberHeld(CuptiUnavailable):
    """Another tool holds CUPTI's one subscriber slot; `holder` is the name CUPTI gives it."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


#: How CUPTI names a subscriber that gave no name: torch's Kineto subscribes so (seen on an H200 with
#: torch 2.11), and stays subscribed for the life of the process once torch's profiler has run.
UNNAMED_SUBSCRIBER = "<not provided>"


#: What polyprof calls itself when it subscribes to CUPTI (CUPTI shows it as "CUPTI for polyprof").
SUBSCRIBER_NAME = "polyprof"


def _ignore_callback(*_args: Any) -> None:
    """The probe subscriber enables no callback domain; CUPTI never calls this."""


def cuda_version_text(version: int) -> str:
    """cuDriverGetVersion's number as a CUDA release: 13000 -> "13.0"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _holder_name(params: Any) -> str:
    """The tool CUPTI named in ``oldSubscriberName``, or a plain phrase when it named none."""
    try:
        name = params.old_subscriber_name
    except Exception:  # CUPTI wrote nothing readable into the buffer
        return "another tool"
    name = "".join(ch for ch in name if ch.isprintable()).strip()
    return name or "another tool"


class CuptiLayer:
    """Thin adapter over ``cupti.cupti``: enums by name, errors turned into reasons.

    ``module`` replaces ``cupti.cupti`` (tests pass a double with the real module's signatures) and
    ``libcupti`` the ctypes bindings of :mod:`polyprof_cuda.libcupti` (found when first needed).
    """

    def __init__(self, module: Any = None, libcupti: Any = None) -> None:
        self._lib = libcupti
        if module is not None:
            self._bind(module)
            return
        try:
            from cupti import cupti
        except ImportError as exc:
            raise CuptiUnavailable(
                f"cupti-python cannot be imported ({exc}): pip install 'polyprof-cuda[cu13]' "
                "(or [cu12] for a CUDA 12 driver)"
            ) from exc
        except OSError as exc:  # libcupti.so missing or of the wrong version
            raise CuptiUnavailable(
                f"libcupti could not be loaded ({exc}): install nvidia-cuda-cupti matching your CUDA, or put "
                "$CUDA_HOME/extras/CUPTI/lib64 on LD_LIBRARY_PATH"
            ) from exc
        self._bind(cupti)

    def _bind(self, cupti: Any) -> None:
        self.c = cupti
        self.kind_values = {
            name: int(getattr(cupti.ActivityKind, name)) for name in dir(cupti.ActivityKind) if name.isupper()
        }

    # -- facts ------------------------------------------------------------------------------------
    @staticmethod
    def package_version() -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("cupti-python")
        except PackageNotFoundError:
            return "unknown"

    def check_ready(self) -> None:
        """Raise CuptiUnavailable with an actionable reason when tracing cannot start here."""
        try:
            self.c.get_timestamp()
        except Exception as exc:
            text = str(exc)
            if "libcuda" in text or "driver is not found" in text.lower():
                raise CuptiUnavailable(f"no NVIDIA driver on this machine ({text})") from exc
            raise CuptiUnavailable(f"CUPTI is not usable: {type(exc).__name__}: {text}") from exc
        driver = self.driver_version()
        major = self.package_version().split(".")[0]
        if driver and major.isdigit() and driver // 1000 < int(major):
            raise CuptiUnavailable(
                f"cupti-python {self.package_version()} needs a CUDA {major} driver, but the driver supports CUDA "
                f"{cuda_version_text(driver)}: install polyprof-cuda[cu{driver // 1000}]"
            )
        if not self.devices():
            raise CuptiUnavailable("the NVIDIA driver reports no CUDA device")

    @staticmethod
    def driver_version() -> int:
        """The CUDA version the driver supports, as cuDriverGetVersion gives it (13000 = 13.0), 0 if unknown."""
        try:
            from cuda.bindings import driver

            driver.cuInit(0)
            err, version = driver.cuDriverGetVersion()
            return int(version) if int(err) == 0 else 0
        except Exception:
            return 0

    def devices(self) -> list[DeviceFacts]:
        """Devices with Kineto's deviceProperties keys (from cuda-bindings)."""
        try:
            from cuda.bindings import driver
        except ImportError:
            return []
        driver.cuInit(0)
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0:
            return []
        attrs = driver.CUdevice_attribute
        keys = {
            "computeMajor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
            "computeMinor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
            "maxThreadsPerBlock": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
            "maxThreadsPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",
            "regsPerBlock": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK",
            "warpSize": "CU_DEVICE_ATTRIBUTE_WARP_SIZE",
            "sharedMemPerBlock": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK",
            "numSms": "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
            "regsPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR",
            "sharedMemPerBlockOptin": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
            "sharedMemPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
        }
        out = []
        for i in range(int(count)):
            _, dev = driver.cuDeviceGet(i)
            _, raw_name = driver.cuDeviceGetName(256, dev)
            name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
            _, total = driver.cuDeviceTotalMem(dev)
            props: dict[str, Any] = {"totalGlobalMem": int(total)}
            for key, attr in keys.items():
                if hasattr(attrs, attr):
                    err, value = driver.cuDeviceGetAttribute(getattr(attrs, attr), dev)
                    if int(err) == 0:
                        props[key] = int(value)
            out.append(DeviceFacts(i, name, props))
        return out

    # -- tracing ----------------------------------------------------------------------------------
    def kind_value(self, name: str) -> int:
        return self.kind_values[name]

    def enable(self, kinds: list[str]) -> None:
        for name in kinds:
            self.c.activity_enable(getattr(self.c.ActivityKind, name))

    def disable(self, kinds: list[str]) -> None:
        for name in kinds:
            try:
                self.c.activity_disable(getattr(self.c.ActivityKind, name))
            except Exception:
                pass

    def use_system_thread_ids(self) -> None:
        self.c.set_thread_id_type(self.c.ActivityThreadIdType.SYSTEM)

    def enable_latency_timestamps(self, enable: bool) -> None:
        self.c.activity_enable_latency_timestamps(1 if enable else 0)

    def preallocate(self, device_buffers: int, semaphore_pools: int) -> dict[str, str]:
        """Have CUPTI allocate its device buffers and profiling-semaphore pools when it initialises a
        context, not while the program runs (Kineto issue #1020: allocations inside the traced window
        stall launches). Returns the refusals: {attribute: CUPTI's error} (an H200 with CUDA 13.0 refuses
        the semaphore pools with ERROR_NOT_SUPPORTED)."""
        import ctypes

        attrs = self.c.ActivityAttribute
        refused = {}
        for name, value in (
            ("DEVICE_BUFFER_PRE_ALLOCATE_VALUE", device_buffers),
            ("PROFILING_SEMAPHORE_PRE_ALLOCATE_VALUE", semaphore_pools),
        ):
            size, number = ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t)), ctypes.c_size_t(value)
            try:
                self.c.activity_set_attribute(
                    int(getattr(attrs, "ATTR_" + name)), ctypes.addressof(size), ctypes.addressof(number)
                )
            except Exception as exc:
                refused[name] = str(exc)
        return refused

    def check_subscriber(self) -> None:
        """Raise when another tool (Nsight, torch.profiler's Kineto) already holds CUPTI.

        Subscribes and unsubscribes at once: CUPTI allows one subscriber per process and, through
        ``cuptiSubscribe_v2``, names the one that holds it. Any other refusal says nothing about other
        tools, so tracing goes on and CUPTI's own errors, if any, surface when activities are enabled.
        """
        c = self.c
        busy = int(c.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        params = None
        if hasattr(c, "subscribe_v2"):
            params = c.SubscriberParams()
            params.struct_size = c.SUBSCRIBER_PARAMS_SIZE  # CUPTI rejects a params struct without its size
            params.subscriber_name = SUBSCRIBER_NAME
        try:
            if params is not None:
                handle = c.subscribe_v2(_ignore_callback, None, params.ptr)
            else:  # releases without cuptiSubscribe_v2: CUPTI cannot name the holder
                handle = c.subscribe(_ignore_callback, None)
        except c.cuptiError as exc:
            if exc.status != busy:
                self._raise_if_cannot_trace(exc)
                return
            holder = _holder_name(params) if params is not None else "another tool"
            raise SubscriberHeld(
                f"another CUPTI subscriber is attached ({holder}): only one tool can trace "
                "CUDA per process; stop torch.profiler's CUDA tracing or Nsight, then profile again",
                holder,
            ) from exc
        c.unsubscribe(handle)

    def _raise_if_cannot_trace(self, exc: Any) -> None:
        """CUPTI errors that mean no tracing is possible in this process, in words that say why."""
        status = self.c.Result(exc.status).name
        if status == "ERROR_NOT_INITIALIZED":
            driver = self.driver_version()
            driver_text = f"CUDA {cuda_version_text(driver)}" if driver else "an unknown CUDA version"
            raise CuptiUnavailable(
                f"CUPTI could not initialise: libcupti {self.libcupti_version()} (cupti-python "
                f"{self.package_version()}) needs a driver at least as new as its CUDA release, and the driver "
                f"supports {driver_text}; install the nvidia-cuda-cupti and cupti-python releases of your "
                "driver's CUDA version, or update the driver"
            ) from exc
        if status in CANNOT_TRACE:
            raise CuptiUnavailable(f"CUPTI cannot trace here: {CANNOT_TRACE[status]} ({status})") from exc

    @staticmethod
    def libcupti_version() -> str:
        """The version of the libcupti wheel that cupti-python loads (nvidia-cuda-cupti)."""
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("nvidia-cuda-cupti", "nvidia-cuda-cupti-cu12"):
            try:
                return version(dist)
            except PackageNotFoundError:
                continue
        return "of unknown version"

    # -- raw buffers ------------------------------------------------------------------------------
    @property
    def lib(self) -> Any:
        if self._lib is None:
            from polyprof_cuda.libcupti import LibCupti

            self.c.get_timestamp()  # cupti-python loads libcupti on its first call
            self._lib = LibCupti.loaded()
        return self._lib

    def register_buffer_callbacks(
        self, requested: Callable[[], tuple[int, int]], completed: Callable[[int, int], None]
    ) -> None:
        """CUPTI's buffer requests and completions go to `requested`/`completed` (raw memory)."""
        self.lib.register_buffer_callbacks(requested, completed)

    def unregister_buffer_callbacks(self) -> None:
        self.lib.unregister()

    def next_record(self, buffer: int, valid: int, record: int) -> int | None:
        return self.lib.next_record(buffer, valid, record)

    def layouts(self) -> dict:
        """Per record family, the newest layout (dtype) cupti-python publishes."""
        from polyprof_cuda.records import newest_layouts

        return newest_layouts(self.c)

    def flush_all(self) -> None:
        self.c.activity_flush_all(1)

    def timestamp(self) -> int:
        return int(self.c.get_timestamp())

    def push_external(self, kind: str, ident: int) -> None:
        self.c.activity_push_external_correlation_id(
            getattr(self.c.ExternalCorrelationKind, EXTERNAL_KIND[kind]), ident
        )

    def pop_external(self, kind: str) -> None:
        self.c.activity_pop_external_correlation_id(
            getattr(self.c.ExternalCorrelationKind, EXTERNAL_KIND[kind])
        )

    def external_kind_value(self, kind: str) -> int:
        return int(getattr(self.c.ExternalCorrelationKind, EXTERNAL_KIND[kind]))

    def callback_name(self, domain: str, cbid: int) -> str:
        dom = self.c.CallbackDomain.RUNTIME_API if domain == "runtime" else self.c.CallbackDomain.DRIVER_API
        try:
            name = self.c.get_callback_name(dom, cbid)
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return f"{'cuda' if domain == 'runtime' else 'cu'}Api(cbid={cbid})"

    def dropped_records(self) -> int:
        try:
            import numpy as np

            out = np.zeros(1, dtype=np.uint64)
            self.c.activity_get_num_dropped_records(0, 0, out.ctypes.data)
            return int(out[0])
        except Exception:
            return 0

    def enum_name(self, enum: str, value: int) -> str:
        try:
            return getattr(self.c, enum)(value).name
        except Exception:
            return str(value)
