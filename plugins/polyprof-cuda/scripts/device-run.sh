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
# attribution, (f) under annotations, (c) overhead and stop-to-trace, (g) Lightning behind
# torch.profiler, (e) NVML counters, then the frameworks without torch.
parts=${PARTS:-env,a_polyprof,a_torch,f_annotations,c_unprofiled,c_torch,c_polyprof,g_lightning_polyprof,g_lightning_torch,e_nvml,a_polyprof_collector,a_after_torch_profiler,a_torch_after_polyprof,b_cupy,b_triton,b_cuda_python,b_numba,b_jax}
# then diagnostics (reported raw): the stop's profile; EXTRA_PARTS adds others (x_cuda_only_torch,
# x_cuda_only_polyprof, x_preallocate, x_coexist_<order>: torch's CPU-only profiler beside polyprof)
parts+=${EXTRA_PARTS-,x_stop_profile}
python3 plugins/polyprof-cuda/scripts/device-check.py --parts "$parts" --budget-s "${BUDGET_S:-330}" \
  --keep-traces "$out" --out "$out/device-check-report.md" 2>&1 | tee "$out/device-check.log"
