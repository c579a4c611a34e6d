"""Only what pyproject.toml cannot say is here: the optional C extension and the on-demand .pth file.

The extension (src/polyprof/_native/csrc, one file per job) speeds up record_function, the Chrome writer and
the host backend's conversion; when it cannot be built (no C compiler, non-Linux clock),
installation still succeeds and polyprof uses its pure-Python implementation.

``polyprof-startup.pth`` goes to site-packages itself (a .pth file works only there): at interpreter
start, when POLYPROF_ON_DEMAND, POLYPROF_TORCH_PROFILER, POLYPROF_ACTIVITIES or POLYPROF_FLIGHT_RECORDER is set, it runs
the top-level module _polyprof_startup (src/_polyprof_startup.py: it reads the variables and waits for
torch's import), and does nothing else. Editable installs get it too.
"""

import glob
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "polyprof-startup.pth"
PTH_SOURCE = os.path.join("src", "polyprof", PTH)


class build_py_with_pth(build_py):
    """build_py, plus the .pth file at the top of what is installed."""

    def run(self):
        super().run()
        os.makedirs(self.build_lib, exist_ok=True)
        shutil.copyfile(PTH_SOURCE, os.path.join(self.build_lib, PTH))
        if getattr(self, "editable_mode", False):
            # an editable wheel takes packages from the source tree and only what is written to its
            # unpacked folder (install_lib there) besides: the .pth goes there
            unpacked = self.distribution.get_command_obj("install").install_lib
            if unpacked:
                shutil.copyfile(PTH_SOURCE, os.path.join(unpacked, PTH))

    def get_outputs(self, *args, **kwargs):
        return [*super().get_outputs(*args, **kwargs), os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        mapping[os.path.join(self.build_lib, PTH)] = PTH_SOURCE
        return mapping

ext_modules = []
if sys.platform.startswith("linux") and sys.implementation.name == "cpython":
    files = ("module", "recorder", "chrome_format", "columns", "perfetto_format", "merge_events", "merge_packets", "merge_passes", "read_events", "read_packets", "perfetto_args", "pytrace", "row_chunks")
    sources = [f"src/polyprof/_native/csrc/{name}.c" for name in files]
    ext_modules.append(
        Extension("polyprof._native._speedups", sources, depends=["src/polyprof/_native/csrc/speedups.h", "src/polyprof/_native/csrc/json_scan.h", "src/polyprof/_native/csrc/protobuf.h",
                                                       *sorted(glob.glob("src/polyprof/_native/csrc/recorder/*.c.h"))], optional=True)
    )

setup(ext_modules=ext_modules, cmdclass={"build_py": build_py_with_pth})
