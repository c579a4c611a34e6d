import ctypes
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fake_rocprofiler", "fake_rocprofiler.c")


@pytest.fixture(scope="session")
def fake_rocprofiler_path(tmp_path_factory):
    """The rocprofiler-sdk test double, compiled now with the system C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc) to build the rocprofiler-sdk test double")
    path = str(tmp_path_factory.mktemp("fake_rocprofiler") / "libfake_rocprofiler.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", path, SOURCE, "-lpthread"], check=True)
    return path


class FakeRocprofiler:
    """Test controls of the double (the same library handle polyprof-rocm loads): a HIP program."""

    def __init__(self, path: str) -> None:
        self.path = path
        lib = self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib.fake_load_kernel.argtypes = [ctypes.c_uint64, ctypes.c_char_p]
        lib.fake_hip_launch.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
        lib.fake_hip_launch.restype = ctypes.c_uint64
        lib.fake_hip_memcpy.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64]
        lib.fake_hip_memcpy.restype = ctypes.c_uint64
        lib.fake_hip_call.argtypes = [ctypes.c_int]
        lib.fake_hip_call.restype = ctypes.c_uint64
        lib.fake_drop.argtypes = [ctypes.c_uint64]
        lib.fake_shrink_records.argtypes = [ctypes.c_uint64]
        lib.fake_record_size.argtypes = [ctypes.c_int]
        lib.fake_record_size.restype = ctypes.c_size_t
        self._names = []

    def load_kernel(self, kernel_id: int, name: str) -> None:
        b = name.encode()
        self._names.append(b)
        self.lib.fake_load_kernel(kernel_id, b)

    def launch(self, kernel_id: int, gpu: int = 0, queue: int = 0x51, duration: int = 20_000) -> int:
        return self.lib.fake_hip_launch(gpu, queue, kernel_id, duration)

    def memcpy(self, direction: int = 2, nbytes: int = 1 << 20, gpu: int = 0) -> int:
        return self.lib.fake_hip_memcpy(gpu, direction, nbytes)

    def call(self, op: int) -> int:
        return self.lib.fake_hip_call(op)


@pytest.fixture
def rocprof(fake_rocprofiler_path, monkeypatch):
    """polyprof-rocm pointed at the double (POLYPROF_ROCPROFILER_LIBRARY)."""
    monkeypatch.setenv("POLYPROF_ROCPROFILER_LIBRARY", fake_rocprofiler_path)
    monkeypatch.delenv("FAKE_ROCPROFILER_VERSION", raising=False)
    monkeypatch.delenv("FAKE_ROCPROFILER_GPUS", raising=False)
    fake = FakeRocprofiler(fake_rocprofiler_path)
    yield fake
    fake.lib.fake_shrink_records(0)
