import ctypes
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fake_pti", "fake_pti.c")
VERSIONS = {"v1": "0.10.0", "v2": "1.2.0"}


@pytest.fixture(scope="session")
def fake_pti_builds(tmp_path_factory):
    """The PTI test double, compiled now with the system C compiler: one build per record layout."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc) to build the PTI test double")
    out = tmp_path_factory.mktemp("fake_pti")
    builds = {}
    for layout, version in VERSIONS.items():
        path = str(out / f"libfake_pti_{layout}.so")
        subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O1",
                "-Wall",
                "-Werror",
                f'-DFAKE_PTI_DEFAULT_VERSION="{version}"',
                "-o",
                path,
                SOURCE,
                "-lpthread",
            ],
            check=True,
        )
        builds[layout] = path
    return builds


class FakePti:
    """Test controls of one build of the double (same library handle polyprof-xpu loads)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.fakePtiEmitKernel.restype = ctypes.c_uint32
        self.lib.fakePtiEmitKernel.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_uint64,
        ]
        self.lib.fakePtiEmitCopy.restype = ctypes.c_uint32
        self.lib.fakePtiEmitCopy.argtypes = [ctypes.c_uint32] * 3 + [
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_int,
        ]
        self.lib.fakePtiEmitFill.restype = ctypes.c_uint32
        self.lib.fakePtiEmitFill.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
        self.lib.fakePtiDroppedRecords.restype = ctypes.c_uint64
        self.lib.fakePtiRecordSize.restype = ctypes.c_size_t
        self.lib.fakePtiRecordSize.argtypes = [ctypes.c_uint32]
        self._names = []

    def kernel(self, name: str, queue: int = 1, device: int = 0, duration: int = 20_000) -> int:
        b = name.encode()
        self._names.append(b)  # PTI's names outlive the call; keep ours alive too
        return self.lib.fakePtiEmitKernel(b, queue, device, duration)

    def copy(self, memcpy_type=6, src=1, dst=2, nbytes=1 << 20, queue=1, device=0) -> int:
        return self.lib.fakePtiEmitCopy(memcpy_type, src, dst, nbytes, queue, device)

    def fill(self, nbytes=4096, value=0, queue=1, device=0) -> int:
        return self.lib.fakePtiEmitFill(nbytes, value, queue, device)


@pytest.fixture(params=["v2", "v1"])
def pti(request, fake_pti_builds, monkeypatch):
    """polyprof-xpu pointed at the double (POLYPROF_PTI_LIBRARY), for each record layout."""
    from polyprof_xpu import library

    monkeypatch.setenv("POLYPROF_PTI_LIBRARY", fake_pti_builds[request.param])
    monkeypatch.delenv("FAKE_PTI_UNAVAILABLE", raising=False)
    fake = FakePti(fake_pti_builds[request.param])
    fake.layout = request.param
    fake.lib.fakePtiSetLateDelivery(0)
    yield fake
    fake.lib.fakePtiSetLateDelivery(0)
    library._loaded.pop(fake.path, None)
