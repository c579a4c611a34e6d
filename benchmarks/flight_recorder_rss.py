"""The flight recorder's memory over a long run at its defaults, switched on as users do
(``POLYPROF_FLIGHT_RECORDER=30``, armed at ``import torch``): a small transformer (the model of
``with_stack_training.py``) trains for `--minutes`; the process's RSS is read every minute. The 30 s ring
fills in the first half minute, then wraps about 20 times in 10 minutes, its spill rotating every ring.

    .venv/bin/python benchmarks/flight_recorder_rss.py [--minutes 10]

Target (issue #62): RSS flat, within 10%, from 1 to 10 minutes. Reported: RSS at each minute, the steps
made, the captures written (one every `--capture-every-s`, by SIGUSR2, as slow steps from a
neighbour's noise made them in a long run; capped by ``max_captures``), and the same loop's RSS without
the recorder (a second process, run after).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from _common import report, scratch_folder

LOOP = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
import torch
from with_stack_training import training_step
minutes = float(sys.argv[1])
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
step = training_step(torch)
start, marks, steps = time.monotonic(), [], 0
while time.monotonic() - start < minutes * 60:
    step()
    steps += 1
    if time.monotonic() - start >= (len(marks) + 1) * 60:
        marks.append(round(rss_mb(), 1))
print(json.dumps({"rss_mb_each_minute": marks, "steps": steps}))
"""


def run(minutes: float, recorder: bool, folder: str, capture_every_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    folder = os.path.join(folder, "recorder" if recorder else "plain")
    os.makedirs(folder)
    if recorder:
        env.update(POLYPROF_FLIGHT_RECORDER="30", POLYPROF_FLIGHT_DIR=os.path.join(folder, "flight"))
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(minutes), here], env=env, cwd=folder,
                            stdout=subprocess.PIPE, text=True)
    while recorder and capture_every_s > 0:  # a capture now and then, as a long job's slow steps make them
        try:
            proc.wait(timeout=capture_every_s)
            break
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR2)
    out, _ = proc.communicate()
    result = json.loads(out.strip().splitlines()[-1])
    flight = os.path.join(folder, "flight")
    result["captures"] = sorted(os.listdir(flight)) if os.path.isdir(flight) else []
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--capture-every-s", type=float, default=50.0, help="SIGUSR2 this often (0: never)")
    args = ap.parse_args()
    folder = scratch_folder()
    with_recorder = run(args.minutes, True, folder, args.capture_every_s)
    marks = with_recorder["rss_mb_each_minute"]
    growth = round(100 * (marks[-1] / marks[0] - 1), 1) if len(marks) > 1 else None
    without = run(min(args.minutes, 2.0), False, folder, 0)
    report("flight_recorder_rss", {"minutes": args.minutes, "recorder": with_recorder,
                                   "rss_growth_first_to_last_minute_pct": growth, "no_recorder_2_min": without})


if __name__ == "__main__":
    main()
