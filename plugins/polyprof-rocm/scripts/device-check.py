#!/usr/bin/env python3
"""AMD GPU check for polyprof-rocm: run on a machine with an AMD GPU, ROCm 6.2+ (rocprofiler-sdk) and
PyTorch's ROCm build.

    python plugins/polyprof-rocm/scripts/device-check.py [--out report.md] [--parts env,a_polyprof,a_torch]

Not yet run on AMD hardware: until it has been, polyprof-rocm's README says so. Each part runs in its
own process (torch.profiler's Kineto registers with rocprofiler-sdk too, and a tool registers once per
process), with a time limit; a failing part is reported, not fatal:

  env         versions (ROCm, rocprofiler-sdk, torch, HIP), polyprof's backends and why any is unavailable;
  a_polyprof  a torch workload (matmuls, elementwise ops, H2D/D2H copies) under polyprof [cpu, rocm]:
              kernels with names, copies, every kernel with an ac2g flow from its HIP launch and an
              External id naming the aten op that launched it;
  a_torch     the same workload under torch.profiler [CPU, CUDA]: its kernel names, to compare with
              polyprof's (same multiset), and its (op, kernel) pairs;
  b_stop      stop-to-trace-written for a 2,000-kernel loop under both;
  c_amdsmi    GPU counters through amdsmi under load, on the GPU's process.
Writes a markdown report (stdout, and --out or $OUT/rocm-device-check-report.md when given); the harness
is polyprof's (polyprof.testing.device_check).
"""

from __future__ import annotations

from collections import Counter

from polyprof.testing.device_check import DeviceCheck

WORKLOAD = r"""
import torch
x = torch.randn(512, 512, device="cuda")
w = torch.randn(512, 512, device="cuda")
def work():
    for _ in range(5):
        y = (x @ w).relu_()
        z = y.sum()
    host = torch.ones(1 << 20).cuda()
    back = z.cpu()
    torch.cuda.synchronize()
work()
"""

PARTS_CODE = {
    "env": r"""
import json, os, subprocess
import polyprof
from polyprof.engine.registry import Registry
out = {"polyprof": polyprof.__version__}
try:
    import torch
    out["torch"] = torch.__version__
    out["hip"] = getattr(torch.version, "hip", None)
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as exc:
    out["torch"] = f"not usable: {exc}"
reg = Registry()
out["backends"] = {e.name: (lambda a: a.reason or "available")(reg.probe(e)) for e in reg.entries()}
print(json.dumps(out))
""",
    "a_polyprof": WORKLOAD + r"""
import json, polyprof
from polyprof.model import ActivityKind
with polyprof.profile(["cpu", "rocm"]) as prof:
    work()
acts = list(prof.trace.activities)
by_corr = {a.correlation: a for a in acts}
kernels = [a for a in acts if a.kind == ActivityKind.KERNEL]
copies = [a for a in acts if a.kind == ActivityKind.GPU_MEMCPY]
flows = {a.flow_id for a in acts if a.flow_id and a.flow_start and a.kind == ActivityKind.RUNTIME}
ops = [by_corr.get(k.external_id) for k in kernels]
print(json.dumps({
    "kernels": sorted(k.name for k in kernels),
    "copies": sorted(c.name for c in copies),
    "with_flow": sum(1 for k in kernels if k.flow_id in flows),
    "op_of_kernel": sorted((o.name if o is not None else "", k.name) for o, k in zip(ops, kernels)),
    "status": prof.trace.backends["rocm"].to_json(),
}))
""",
    "a_torch": WORKLOAD + r"""
import json, torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    work()
names = sorted(e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
print(json.dumps({"kernels": names}))
""",
    "b_stop": r"""
import json, os, tempfile, time, torch, polyprof
x = torch.randn(64, device="cuda")
def loop():
    for _ in range(2000):
        x.add_(1)
    torch.cuda.synchronize()
loop()
folder = tempfile.mkdtemp()
prof = polyprof.profile(["cpu", "rocm"])
prof.start(); loop()
t0 = time.perf_counter(); prof.stop(); prof.export_chrome_trace(os.path.join(folder, "p.json"))
polyprof_ms = (time.perf_counter() - t0) * 1e3
from torch.profiler import ProfilerActivity, profile
p = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]); p.__enter__(); loop()
t0 = time.perf_counter(); p.__exit__(None, None, None); p.export_chrome_trace(os.path.join(folder, "t.json"))
print(json.dumps({"polyprof_stop_to_trace_ms": round(polyprof_ms, 1), "torch_stop_to_trace_ms": round((time.perf_counter() - t0) * 1e3, 1)}))
""",
    "c_amdsmi": WORKLOAD + r"""
import json, polyprof
with polyprof.profile(["cpu", "rocm"], backend_options={"amdsmi": {"interval_ms": 20}}) as prof:
    for _ in range(20):
        work()
names = sorted({s.name for s in prof.trace.counters.samples})
print(json.dumps({"counters": names, "status": prof.trace.backends.get("amdsmi").to_json() if "amdsmi" in prof.trace.backends else None}))
""",
}


def verdicts(results: dict) -> list[str]:
    lines = []
    ours, theirs = results.get("a_polyprof", {"error": "not run"}), results.get("a_torch", {"error": "not run"})
    for name, result in results.items():
        if "error" in result:
            lines.append(f"- {name}: **failed**: {result['error'].strip().splitlines()[-1] if result['error'].strip() else ''}")
    if "error" not in ours:
        n = len(ours["kernels"])
        lines.append(f"- polyprof: {n} kernels, {len(ours['copies'])} copies, {ours['with_flow']}/{n} with a flow from their launch")
        named = sum(1 for op, _ in ours["op_of_kernel"] if op.startswith("aten::"))
        lines.append(f"- kernels whose External id is an aten op: {named}/{n}")
    if "error" not in ours and "error" not in theirs:
        same = Counter(ours["kernels"]) == Counter(theirs["kernels"])
        lines.append(f"- same kernel names as torch.profiler: **{same}**")
    return lines


CHECK = DeviceCheck("polyprof-rocm device check", report=verdicts, report_name="rocm-device-check-report.md")
for _name, _code in PARTS_CODE.items():
    CHECK.code_part(_name, _code)


if __name__ == "__main__":
    CHECK.main()
