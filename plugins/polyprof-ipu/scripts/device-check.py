#!/usr/bin/env python3
"""IPU check for polyprof-ipu: run on a machine with a Graphcore IPU and the Poplar SDK (its enable.sh
sourced) and PopTorch installed.

    python plugins/polyprof-ipu/scripts/device-check.py [--out report.md]

Not yet run on an IPU: until it has been, polyprof-ipu's README says so. In one child process (a time
limit of 600 s), with PVTI_OPTIONS set so that PopTorch's own tracepoints are on:

  - a small PopTorch model compiled and run for a few steps under polyprof [cpu, ipu] (the ipu backend
    sets POPLAR_ENGINE_OPTIONS, the pvti backend wraps libpvti);
  - checks: an `IPU i` device with program rows; every step inside its run's host time window; as many
    steps as the report itself lists (opened again with pva); PVTI tracepoints from PopTorch's channel
    on the host rows; the ipu backend's status names the report it read.
Writes a markdown report (stdout, and --out or $OUT/ipu-device-check-report.md when given); the harness
is polyprof's (polyprof.testing.device_check).
"""

from __future__ import annotations

from polyprof.testing.device_check import DeviceCheck

MODEL_RUN = r"""
import json, os
os.environ.setdefault("PVTI_OPTIONS", '{"enable": "true"}')
import torch, poptorch, polyprof
from polyprof.model import ActivityKind

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
    def forward(self, x):
        return self.fc(x).relu().sum()

model = poptorch.inferenceModel(Net())
x = torch.randn(8, 64)
with polyprof.profile(["cpu", "ipu"]) as prof:
    for _ in range(3):
        model(x)
trace = prof.trace
acts = list(trace.activities)
ipus = [d.name for d in trace.devices if d.key.startswith("ipu")]
steps = [a for a in acts if trace.devices[a.device].key.startswith("ipu")]
pvti = [a for a in acts if (a.cat or "").startswith("pvti:")]
status = {name: s.to_json() for name, s in trace.backends.items() if name in ("ipu", "pvti")}
report_path = status.get("ipu", {}).get("details", {}).get("report", "")
listed = None
if report_path:
    import pva
    report = pva.openReport(report_path)
    listed = sum(len(run.steps) for run in report.execution.runs)
print(json.dumps({"ipus": ipus, "steps": len(steps), "steps_in_report": listed,
                  "pvti_tracepoints": sorted({a.name for a in pvti})[:20], "status": status}))
"""


def verdicts(results: dict) -> list[str]:
    result = results.get("ipu_model", {"error": "not run"})
    if "error" in result:
        return [f"- ipu_model: **failed**: {result['error'].strip()[-300:]}"]
    return [f"- IPU devices: {result['ipus']}",
            f"- steps on the timeline: {result['steps']}; in the report: {result['steps_in_report']}"
            f" (same: **{result['steps'] == result['steps_in_report']}**)",
            f"- PVTI tracepoints seen: {len(result['pvti_tracepoints'])}"]


CHECK = DeviceCheck("polyprof-ipu device check", report=verdicts, report_name="ipu-device-check-report.md",
                    timeout_s=600)
CHECK.code_part("ipu_model", MODEL_RUN)


if __name__ == "__main__":
    CHECK.main()
