"""Compile polyprof's torch observer against another torch release's headers and libraries, without
installing or importing that torch (its PyPI wheel is downloaded with --no-deps and partly unpacked).

    .venv/bin/python scripts/torch-observer-compile-check.py 2.4.1 [2.6.0 ...]

Checks that the RecordFunction API the observer uses exists with the same signatures in that release
(the C++ ABI flag is read from the wheel's TorchConfig.cmake). It does not run
the observer: that needs the torch importable (tests/torch/test_torch_observer.py on the installed torch).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

from polyprof.torch.observer import builder


def check(version: str, work: Path) -> bool:
    folder = work / version
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", f"torch=={version}", "--no-deps", "-d", str(folder)],
        check=True,
    )
    (wheel,) = folder.glob("torch-*.whl")
    with zipfile.ZipFile(wheel) as z:
        wanted = [
            n
            for n in z.namelist()
            if n.startswith("torch/include/") or n in ("torch/lib/libtorch_cpu.so", "torch/lib/libc10.so")
        ]
        z.extractall(folder, wanted)
        # the wheel's CMake config says which libstdc++ ABI it was built with
        config = z.read("torch/share/cmake/Torch/TorchConfig.cmake").decode()
        found = re.search(r"_GLIBCXX_USE_CXX11_ABI=(\d)", config)
        abi = bool(int(found.group(1))) if found else True
    fake = types.SimpleNamespace(
        __file__=str(folder / "torch" / "__init__.py"),
        __version__=version,
        _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=abi),
    )
    out = folder / "observer.so"
    done = subprocess.run(builder.compile_command(fake, out), capture_output=True, text=True)
    ok = done.returncode == 0
    print(f"torch {version} (C++11 ABI {int(abi)}): {'compiles and links' if ok else 'FAILED'}")
    if not ok:
        print(done.stderr[-3000:])
    return ok


def main(versions: list[str]) -> int:
    with tempfile.TemporaryDirectory() as work:
        results = [check(v, Path(work)) for v in versions or ["2.4.1"]]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
