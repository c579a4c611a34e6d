#!/usr/bin/env bash
# On the lent GPU machine (device tool), from the repository root, with .whl/ carried (made by
# prepare-device-run.sh): install the wheels beside the machine's packages, then run device-check.py.
# The report and the log come back in $OUT.
set -uo pipefail
out=${OUT:-/tmp/polyprof-device-check}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "installing the carried wheels failed" >&2; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L || echo "nvidia-smi: not available"
python3 plugins/polyprof-cuda/scripts/device-check.py --out "$out/device-check-report.md" 2>&1 | tee "$out/device-check.log"
