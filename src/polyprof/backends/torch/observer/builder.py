"""Builds polyprof's PyTorch operator observer (``observer.cpp``) against the installed torch, once per
torch build, and caches the shared library::

    python -m polyprof.backends.torch.observer          # build now; scripts/setup.sh does this

Compiling against the torch that will load it is what keeps one source working across torch versions
(2.4+) and C++ ABIs, the way ``torch.utils.cpp_extension`` and Triton build their native parts.

* Compiler: ``$CXX``, else ``c++`` (any C++17 compiler; g++ and clang++ work). About 3 s.
* Cache: ``$POLYPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/polyprof``, else ``~/.cache/polyprof``, under
  ``torch-observer/<key>/``; the key hashes the source, the torch version and location, the compiler
  and the flags, so upgrading torch builds a new library and never loads a stale one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sysconfig
import tempfile
import warnings
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("observer.cpp")
LIBRARY_NAME = "polyprof_torch_observer.so"
BUILD_TIMEOUT_S = 300


class BuildError(RuntimeError):
    """The observer could not be built; the message says why and what to do."""


def cache_root() -> Path:
    explicit = os.environ.get("POLYPROF_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "polyprof"


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


def torch_paths(torch: Any) -> tuple[Path, Path]:
    """(include dir, lib dir) of an imported torch."""
    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


def compile_command(torch: Any, output: Path) -> list[str]:
    include, lib = torch_paths(torch)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return [
        compiler(),
        "-O2",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-w",  # torch's headers warn under C++17; the warnings are theirs
        # torch's release builds define NDEBUG, and some of its classes have members only without it:
        # the observer must see the same layout
        "-DNDEBUG",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-I{sysconfig.get_paths()['include']}",  # Python.h: eager with_modules walks the Python frames
        str(SOURCE),
        f"-L{lib}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{lib}",
        "-o",
        str(output),
    ]


def library_path(torch: Any) -> Path:
    """Where the library for this torch is (or will be) cached."""
    return cache_root() / "torch-observer" / _library_key(torch) / LIBRARY_NAME


_keys: dict[tuple[int, str], str] = {}  # (id of the torch module, compiler): key, once per process


def _library_key(torch: Any) -> str:
    # every profile's start asks (hashing the source and resolving paths took ~0.8 ms of it)
    known = (id(torch), compiler())
    if known not in _keys:
        digest = hashlib.sha256(SOURCE.read_bytes())
        for part in (
            getattr(torch, "__version__", ""),
            getattr(getattr(torch, "version", None), "git_version", ""),
            str(Path(torch.__file__).resolve().parent),
            " ".join(compile_command(torch, Path("out"))),
        ):
            digest.update(b"\0" + str(part).encode())
        _keys[known] = digest.hexdigest()[:20]
    return _keys[known]


def _trusted(path: Path) -> bool:
    """Whether a cached library may be loaded: a regular file owned by this user (or root) that nobody
    else can write, in a folder nobody else can write (or the file could be swapped after this check).
    Loading a library runs its code: one planted in a shared cache must not be."""
    try:
        st, folder = os.lstat(path), os.lstat(path.parent)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or not stat.S_ISDIR(folder.st_mode):
        return False
    mine = (os.getuid(), 0)
    writable_by_others = stat.S_IWGRP | stat.S_IWOTH
    return (
        st.st_uid in mine
        and folder.st_uid in mine
        and not st.st_mode & writable_by_others
        and not folder.st_mode & writable_by_others
    )


def cached_library(torch: Any) -> Path | None:
    """The library for `torch` if it is already built and trusted, else None (nothing is compiled)."""
    target = library_path(torch)
    return target if _trusted(target) else None


def build(torch: Any, *, force: bool = False) -> Path:
    """The cached library for `torch`, compiled first if missing, untrusted (see _trusted: then rebuilt,
    with a warning) or when `force`. Raises BuildError."""
    target = library_path(torch)
    if target.exists() and not force:
        if _trusted(target):
            return target
        warnings.warn(
            f"polyprof: {target} is not owned by you or is writable by others; rebuilding it instead of "
            "loading it",
            stacklevel=3,
        )
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise BuildError(
            f"no C++ compiler: {cxx!r} is not on PATH. Install one (Debian/Ubuntu: apt install g++) or "
            "point CXX at one"
        )
    include, _ = torch_paths(torch)
    if not (include / "ATen" / "record_function.h").exists():
        raise BuildError(f"this torch has no C++ headers ({include}/ATen/record_function.h is missing)")
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(
            f"cannot create the cache folder {target.parent}: {exc}; set POLYPROF_CACHE_DIR"
        ) from exc
    # compile to a private name, then rename: concurrent builds never load a half-written library
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                compile_command(torch, Path(tmp)),
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"{cxx} took more than {BUILD_TIMEOUT_S} s") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            raise BuildError(f"{cxx} failed (exit {done.returncode}) compiling {SOURCE.name}:\n{tail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
