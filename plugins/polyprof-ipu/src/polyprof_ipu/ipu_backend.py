"""The ``ipu`` backend: Graphcore IPU execution read from Poplar's ``profile.pop`` after the run, through
the PopVision Analysis library (``pva``, in the Poplar SDK) (activity group IPU).

::

    with polyprof.profile(["cpu", "ipu"]) as prof:   # the program runs its Poplar engine in here
        train()

There is no live device-tracing API for the IPU: Poplar writes a report when ``POPLAR_ENGINE_OPTIONS``
asks for one. At prepare, when the user has not set that variable, the backend sets it
(``autoReport.all``, a report directory of its own, or ``backend_options={"ipu": {"report_dir": ...}}``);
when the user has, it reads the report from the directory named there. At collect it opens the newest
``profile.pop`` written since the profile started and maps each execution run and its steps onto one
``IPU i`` device per IPU, a row of programs per IPU: a run starts at its host timestamp
(``run.microseconds.start``, taken as Unix-epoch microseconds), its steps follow one another, each as
long as its cycles on that IPU at the target's clock frequency. So the device timeline is only as
aligned as the runs' host timestamps; the trace says so in the backend's status. The Poplar SDK is
legacy (its last releases, 3.3/3.4, are from 2023). **Not yet run on an IPU**: tested against a
stand-in ``pva`` shaped after the documented PopVision API.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time
from typing import Any

from polyprof.plugin import (
    API_VERSION,
    ActivityKind,
    Availability,
    BackendTraits,
    Option,
    OptionSchema,
    ProfileConfig,
    SessionContext,
    SessionTraits,
    Sink,
    host_ns,
)

ENGINE_OPTIONS = "POPLAR_ENGINE_OPTIONS"


def _import_pva() -> Any:
    import pva

    return pva


class IpuSession:
    traits = SessionTraits(in_process=True)

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.report_dir = ctx.options.get("report_dir") or ""
        self.set_by_us = False
        self.made_dir: str | None = None  # the temporary folder made for Poplar's report, removed at close
        self.previous: str | None = None
        self.started_wall = 0.0

    def prepare(self) -> None:
        self.previous = os.environ.get(ENGINE_OPTIONS)
        if self.previous is None:
            if not self.report_dir:
                self.report_dir = self.made_dir = tempfile.mkdtemp(prefix="polyprof-ipu-")
            os.environ[ENGINE_OPTIONS] = json.dumps({"autoReport.all": "true", "autoReport.directory": self.report_dir})
            self.set_by_us = True
        elif not self.report_dir:
            try:
                self.report_dir = str(json.loads(self.previous).get("autoReport.directory") or ".")
            except (ValueError, AttributeError):
                self.report_dir = "."
                self.ctx.report.warning(f"{ENGINE_OPTIONS} is not a JSON object: the report is looked for in the current folder")

    def start(self) -> None:
        self.started_wall = time.time()

    def stop(self) -> None:
        pass

    def _report_file(self) -> str | None:
        found = [p for p in glob.glob(os.path.join(self.report_dir, "**", "profile.pop"), recursive=True)
                 if os.path.getmtime(p) >= self.started_wall - 1]
        return max(found, key=os.path.getmtime) if found else None

    def collect(self, sink: Sink) -> None:
        path = self._report_file()
        self.ctx.report.detail("timeline", "read from profile.pop after the run; runs placed at their host timestamps")
        if path is None:
            self.ctx.report.warning(f"Poplar wrote no profile.pop in {self.report_dir} during the profile "
                                    "(did the program run a Poplar engine in it?)")
            return
        report = _import_pva().openReport(path)
        self.ctx.report.detail("report", path if self.made_dir is None else
                               f"{path} (a temporary folder, removed at the end: set report_dir to keep it)")
        self.ctx.report.detail("poplar", str(getattr(getattr(report, "poplarVersion", None), "string", "")))
        hz = float(report.compilation.target.clockFrequency)
        wall, host = time.time_ns(), host_ns()  # Unix-epoch microseconds onto the host clock
        devices: dict[int, tuple[int, int]] = {}
        for run_index, run in enumerate(report.execution.runs):
            start_ns = int(run.microseconds.start * 1000) - wall + host
            cursor: dict[int, int] = {}
            for step_index, step in enumerate(run.steps):
                name = str(getattr(step.program, "name", "") or f"step {step_index}")
                for ipu_index, ipu in enumerate(step.ipus):
                    if ipu_index not in devices:
                        dev = sink.device(f"ipu:{ipu_index}", type="ipu", index=ipu_index, name=f"IPU {ipu_index}",
                                          label=f"IPU {ipu_index}")
                        devices[ipu_index] = (dev, sink.resource(dev, 0, "programs"))
                    dev, row = devices[ipu_index]
                    begin = cursor.get(ipu_index, start_ns)
                    cycles = int(ipu.cycles)
                    end = begin + int(cycles / hz * 1e9)
                    cursor[ipu_index] = end
                    sink.activity(ActivityKind.KERNEL, name, device=dev, resource=row, start=begin, end=end, cat="ipu_program",
                                  args={"cycles": cycles, "run": str(getattr(run, "name", run_index)), "step": step_index})

    def close(self) -> None:
        if self.set_by_us:
            os.environ.pop(ENGINE_OPTIONS, None)
            self.set_by_us = False
        if self.made_dir is not None:  # a Poplar report runs to gigabytes: not left behind in /tmp
            shutil.rmtree(self.made_dir, ignore_errors=True)
            self.made_dir = None


class IpuBackend:
    name = "ipu"
    api_version = API_VERSION
    activities = frozenset({"IPU"})
    options = OptionSchema(
        Option("report_dir", str, default="",
               help="where Poplar writes profile.pop, kept there (default: a temporary folder, removed at the end)")
    )
    traits = BackendTraits(in_process=True)

    def probe(self) -> Availability:
        try:
            pva = _import_pva()
        except ImportError:
            return Availability.no("needs the PopVision Analysis library (the pva module of a Poplar SDK: source its "
                                   "enable.sh); the Poplar SDK is legacy, its last releases are from 2023")
        version = str(getattr(pva, "__version__", ""))
        return Availability.yes(devices=["IPUs, read from profile.pop after the run"], pva=version)

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> IpuSession:
        return IpuSession(config, ctx)


backend = IpuBackend()
