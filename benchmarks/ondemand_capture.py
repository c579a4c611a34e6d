"""What an on-demand capture costs the training loop it captures: step times before, during and at the
step where the capture stops (the stop hand-over; merging and writing run on polyprof's threads).

    .venv/bin/python benchmarks/ondemand_capture.py [--steps 20]

A torch training loop (a 20-layer MLP, SGD) started with POLYPROF_ON_DEMAND=1 and no polyprof import
records each step's wall time; `polyprof capture PID --steps N` captures it from another process. The
loop's own record tells: the median step before the capture, the median while it records, the step the
capture stopped at (the longest step there) and the slowest step while the trace was being written.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import report

LOOP = r"""
import json, os, sys, time, torch
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
out, stop_file = sys.argv[1], sys.argv[2]
times = []
while not os.path.exists(stop_file):
    t0 = time.perf_counter_ns()
    opt.zero_grad()
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
    times.append((time.time(), time.perf_counter_ns() - t0))
json.dump(times, open(out, "w"))
"""


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runtime = os.path.join(folder, "run")
        os.mkdir(runtime, 0o700)
        env = {**os.environ, "POLYPROF_ON_DEMAND": "1", "XDG_RUNTIME_DIR": runtime, "OMP_NUM_THREADS": "1"}
        script, record, stop = (os.path.join(folder, n) for n in ("loop.py", "times.json", "stop"))
        open(script, "w").write(LOOP)
        loop = subprocess.Popen([sys.executable, script, record, stop], env=env)
        sock = os.path.join(runtime, "polyprof", f"{loop.pid}.sock")
        while not os.path.exists(sock):
            time.sleep(0.05)
        time.sleep(3.0)  # steady state (torch imported, the loop warm)
        asked = time.time()
        cli = subprocess.run([sys.executable, "-m", "polyprof", "capture", str(loop.pid), "--steps", str(args.steps), "-o",
                              os.path.join(folder, "cap.json"), "--no-summary"], env=env, capture_output=True, text=True)
        written = time.time()
        doc = json.load(open(os.path.join(folder, "cap.json")))
        time.sleep(1.0)
        open(stop, "w").close()
        loop.wait(timeout=60)
        times = json.load(open(record))
        assert cli.returncode == 0, cli.stderr
    started = doc["polyprofCaptureStart"]["unix_time"]
    spans = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    recorded_until = started + max(e["ts"] + e["dur"] for e in spans) / 1e6 - min(e["ts"] for e in spans) / 1e6
    before = [t for when, t in times if when < asked]
    during = [t for when, t in times if started <= when <= recorded_until]
    writing = [t for when, t in times if recorded_until < when <= written]
    after = [t for when, t in times if when > written]
    report("ondemand_capture", {
        "steps_captured": len(spans),
        "step_ms_median_before": round(statistics.median(before[-200:]) / 1e6, 3),
        "step_ms_median_while_recording": round(statistics.median(during) / 1e6, 3),
        "step_ms_max_at_the_stop_and_while_written": round(max(writing[:5] or [0]) / 1e6, 3),
        "step_ms_median_while_written": round(statistics.median(writing) / 1e6, 3) if writing else None,
        "step_ms_median_after": round(statistics.median(after) / 1e6, 3) if after else None,
        "capture_asked_to_trace_written_s": round(written - asked, 2),
    })


if __name__ == "__main__":
    main()
