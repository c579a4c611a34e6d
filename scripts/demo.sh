#!/usr/bin/env bash
# Quickstart, main job: set up, profile the bundled example workload, write the trace, print the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p traces
.venv/bin/polyprof run -o traces/workload.json.gz examples/workload.py
echo "Open traces/workload.json.gz in https://ui.perfetto.dev or chrome://tracing; summarise again with:"
echo "  .venv/bin/polyprof summary traces/workload.json.gz"
