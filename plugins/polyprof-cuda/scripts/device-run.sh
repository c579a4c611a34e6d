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
# The most telling parts first, so that a spent budget leaves out the least: (a) kernel identity and
# attribution, (c) overhead and stop-to-trace, then the frameworks without torch.
parts=${PARTS:-env,a_polyprof,a_torch,c_unprofiled,c_torch,c_polyprof,a_polyprof_collector,b_cupy,b_triton,b_cuda_python,b_numba,b_jax}
# then what the check knows of how polyprof behaves there (reported raw): the CUDA-only overhead, the
# stop's profile, torch's CPU-only profiler beside polyprof in each order, CUPTI's buffer attributes
parts+=${EXTRA_PARTS-,x_cuda_only_torch,x_cuda_only_polyprof,x_stop_profile,x_preallocate,x_coexist_alone,x_coexist_polyprof_first_torch_stops_first,x_coexist_torch_first,x_coexist_torch_first_torch_stops_first}
python3 plugins/polyprof-cuda/scripts/device-check.py --parts "$parts" --budget-s "${BUDGET_S:-330}" \
  --keep-traces "$out" --out "$out/device-check-report.md" 2>&1 | tee "$out/device-check.log"
