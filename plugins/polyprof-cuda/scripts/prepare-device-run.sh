#!/usr/bin/env bash
# Prepare the wheels that the lent GPU machine needs for device-run.sh, in .whl/ at the repository root.
#
#   bash plugins/polyprof-cuda/scripts/prepare-device-run.sh
#
# That machine (see the device tool's KINDS.md) has Python 3.12, torch (CUDA 13.0), CuPy, Numba, JAX,
# Triton, cuda-bindings and nvidia-cuda-cupti 13.0, but no package index. It lacks polyprof,
# polyprof-cuda, cupti-python, orjson, cxxfilt and Lightning: built or downloaded here for CPython 3.12
# on x86-64 Linux.
# cupti-python must match the libcupti there and the driver's CUDA (580 driver: CUDA 13.0), hence
# 13.0.1 (needs nvidia-cuda-cupti ~= 13.0); override with CUPTI_PYTHON_VERSION.
# Then, with the device tool: run(command="bash plugins/polyprof-cuda/scripts/device-run.sh",
# carry=[".whl"], timeout_s=420).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
find_python312() {
  local candidate
  for candidate in "${PY312:-}" python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}
PY312=$(find_python312)
[ -n "$PY312" ] || { echo "needs Python 3.12 (set PY312, or pyenv install 3.12) to build polyprof's cp312 wheel" >&2; exit 1; }
CUPTI_PYTHON_VERSION=${CUPTI_PYTHON_VERSION:-13.0.1}
rm -rf .whl build plugins/polyprof-cuda/build && mkdir -p .whl  # stale build/ trees would go into the wheels
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "cupti-python==${CUPTI_PYTHON_VERSION}" "orjson>=3.9"
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "cxxfilt>=0.3,<0.4" "nvidia-ml-py>=12"  # pure Python
# part (g): Lightning and what it needs beyond torch (pure Python but PyYAML)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "lightning==2.6.6" "lightning-utilities" \
  "torchmetrics" "fsspec" "tqdm"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "PyYAML>=6"
"$PY312" -m pip wheel -q --no-deps -w .whl . ./plugins/polyprof-cuda
ls -l .whl
du -sh .whl
