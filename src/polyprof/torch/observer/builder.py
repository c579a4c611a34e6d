"""Builds polyprof's PyTorch operator observer (``observer.cpp``) against the installed torch, once per
torch build, and caches the shared library::

    python -m polyprof.torch.observer          # build now; scripts/setup.sh does this

Compiling against the torch that will load it is what keeps one source working across torch versions
(2.4+) and C++ ABIs, the way ``torch.utils.cpp_extension`` and Triton build their native parts.

* Compiler: ``$CXX``, else ``c++`` (any C++17 compiler; g++ and clang++ work). About 3 s.
* Cache: ``$POLYPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/polyprof``, else ``~/.cache/polyprof``, under
  ``torch-observer/<key>/``; the key hashes the source, the torch version and location, the compiler
  and the flags, so upgrading torch builds a new library and never loads a stale one.
* Trust: loading a library runs its code, and a shared cache can be another user's. The compiler writes
  into a private temporary folder (0700, this user's); the result is moved into the cache only when the
  cache folder is this user's (or root's) and nobody else can write it, else it is loaded from the
  private folder (with a warning saying how to fix the cache). The loader (:func:`open_trusted`) opens
  the file without following links, checks the open file (regular, this user's or root's, not writable
  by group or others) and loads exactly that file through ``/proc/self/fd``, so a name swapped after the
  check is never what is loaded.
"""

from __future__ import annotations

import atexit
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
#: the sections observer.cpp includes (one translation unit): part of the source a library is keyed by
SECTIONS = Path(__file__).with_name("sections")
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
        for section in sorted(SECTIONS.glob("*.cpp.h")):
            digest.update(b"\0" + section.name.encode() + b"\0" + section.read_bytes())
        for part in (
            getattr(torch, "__version__", ""),
            getattr(getattr(torch, "version", None), "git_version", ""),
            str(Path(torch.__file__).resolve().parent),
            " ".join(compile_command(torch, Path("out"))),
        ):
            digest.update(b"\0" + str(part).encode())
        _keys[known] = digest.hexdigest()[:20]
    return _keys[known]


WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _trusted_stat(st: os.stat_result, kind: int) -> bool:
    """Of `kind`, this user's or root's, and nobody else can write it."""
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid in (os.getuid(), 0) and not st.st_mode & WRITABLE_BY_OTHERS


def _trusted_folder(folder: Path) -> bool:
    """A real folder of this user's (or root's) that nobody else can write: nobody else can put or swap
    a file in it."""
    try:
        return _trusted_stat(os.lstat(folder), stat.S_IFDIR)
    except OSError:
        return False


def _trusted(path: Path) -> bool:
    """Whether a cached library may be loaded: a regular file owned by this user (or root) that nobody
    else can write, in a folder nobody else can write (or the file could be swapped after this check).
    Loading a library runs its code: one planted in a shared cache must not be."""
    try:
        return _trusted_stat(os.lstat(path), stat.S_IFREG) and _trusted_folder(path.parent)
    except OSError:
        return False


class TrustedLibrary:
    """An open, checked library file; ``path`` names exactly it (``/proc/self/fd/N``) while it is open::

    with open_trusted(path) as lib:
        ctypes.CDLL(lib.path)
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.path = f"/proc/self/fd/{fd}"

    def __enter__(self) -> TrustedLibrary:
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)


def open_trusted(path: str | Path) -> TrustedLibrary:
    """`path` opened without following a link and checked as opened (a regular file of this user's or
    root's that group and others cannot write); OSError naming what is wrong otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not _trusted_stat(st, stat.S_IFREG):
            raise PermissionError(
                f"{path} is not a regular file of this user's that only this user can write (owner uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): not loaded"
            )
    except BaseException:
        os.close(fd)
        raise
    return TrustedLibrary(fd)

def cached_library(torch: Any) -> Path | None:
    """The library for `torch` if it is already built and trusted, else None (nothing is compiled)."""
    target = library_path(torch)
    return target if _trusted(target) else None


def build(torch: Any, *, force: bool = False) -> Path:
    """The cached library for `torch`, compiled first if missing, untrusted (see _trusted: then rebuilt,
    with a warning) or when `force`. Raises BuildError. Where the cache folder is not this user's alone,
    the library is built and left in a private temporary folder instead (with a warning)."""
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
    private = Path(tempfile.mkdtemp(prefix="polyprof-observer-"))  # 0700, this user's: nobody can swap in it
    built = private / LIBRARY_NAME
    try:
        done = subprocess.run(compile_command(torch, built), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(private, ignore_errors=True)
        raise BuildError(f"{cxx} took more than {BUILD_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        shutil.rmtree(private, ignore_errors=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise BuildError(f"{cxx} failed (exit {done.returncode}) compiling {SOURCE.name}:\n{tail}")
    os.chmod(built, 0o755)
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        pass  # said below: the cache folder is not usable
    if not _trusted_folder(target.parent):
        warnings.warn(
            f"polyprof: the observer's cache folder {target.parent} is not a folder of yours that only you can "
            f"write; the library built for this process stays in {private}. Set POLYPROF_CACHE_DIR to a folder "
            "of your own to keep it",
            stacklevel=3,
        )
        atexit.register(shutil.rmtree, private, True)  # (the loaded library stays mapped)
        return built
    os.replace(built, target)  # within this user's folders: concurrent builds never load a half-written one
    shutil.rmtree(private, ignore_errors=True)
    return target
