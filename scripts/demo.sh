#!/usr/bin/env bash
# Quickstart, main job: set up (polyprof, its plugins, PoCL's OpenCL CPU device), profile the bundled
# workload (numpy, OpenCL kernels and copies on that device, a torch model where torch is installed),
# write the trace, print the summary, write the HTML report and print its path.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p traces
.venv/bin/polyprof run -o traces/workload.json.gz examples/workload.py
report=$(.venv/bin/polyprof report traces/workload.json.gz -o traces/workload-report.html)
echo "Open traces/workload.json.gz in https://ui.perfetto.dev or chrome://tracing; summarise again with:"
echo "  .venv/bin/polyprof summary traces/workload.json.gz    (--view steps|kernels|ops|idle|launch|devices|backends)"
echo "The report (open it in a browser, it needs no network): $report"
