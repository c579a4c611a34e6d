#!/usr/bin/env bash
# Create .venv (if needed) and install polyprof, its plugins and, with --test, what the tests use.
# Idempotent: safe to run again; pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
pip_install() {
  # this machine's pip config names local mirrors that may be absent; their warnings are noise
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2)
}
if [ "${1:-}" = "--test" ]; then
  pip_install -e ".[test]"
  # The CPU build of torch (tests compare against torch.profiler). On Python 3.11 this machine kind has
  # the wheel on disk; elsewhere the torch tests skip with a reason if it cannot be installed.
  pip_install "torch==2.13.0" || echo "setup: torch not installed; torch comparisons will be skipped"
  # Lightning, accelerate, transformers, torchtitan on that torch (tests/profiler/test_frameworks.py)
  if .venv/bin/python -c "import torch" 2>/dev/null; then
    pip_install -e ".[frameworks]" || echo "setup: the frameworks were not installed; their tests will be skipped"
  fi
  # libfaketime gives one test rank another wall clock (tests/torch/test_distributed.py): Debian, as root only
  if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q libfaketime || { apt-get update -q && apt-get install -y -q libfaketime; }; } >/dev/null 2>&1 \
      || echo "setup: libfaketime not installed; the clock-offset test will be skipped"
  fi
  # Java for Spark in local mode (tests/store/test_store_spark.py): Debian, as root only
  if ! command -v java >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q openjdk-17-jre-headless || { apt-get update -q && apt-get install -y -q openjdk-17-jre-headless; }; } \
      >/dev/null 2>&1 || echo "setup: Java not installed; the Spark tests will be skipped"
  fi
  # headless Chromium opens the HTML reports in tests/report/test_report.py (driven by Playwright): Debian, as root only
  if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null 2>&1 \
      || echo "setup: chromium not installed; the report's browser tests will be skipped"
  fi
  # build polyprof's torch operator observer now rather than inside the first profile (~5 s, cached)
  .venv/bin/python -m polyprof.torch.observer || echo "setup: the torch observer was not built"
  # the tools users read traces with, in their own environment (HTA needs pandas < 3):
  # tests/formats/test_trace_consumers.py runs them on polyprof's traces
  if [ ! -x .venv-consumers/bin/python ]; then
    "$PYTHON" -m venv .venv-consumers
  fi
  .venv-consumers/bin/python -m pip install -q --disable-pip-version-check \
    "HolisticTraceAnalysis==0.5.0" "pandas<3" "torch-tb-profiler==0.4.3" 2> >(grep -v "^WARNING: Location" >&2) \
    || echo "setup: HTA / torch-tb-profiler not installed; their tests will be skipped"
else
  pip_install -e ".[report,counters]"
fi
# Each plugin is its own distribution; install every one that is in the tree. For the tests, with the
# plugin's "test" extra where it has one (polyprof-opencl's brings PoCL: a real OpenCL device on the CPU);
# for the demo, with its "pocl" extra where it has one (the same device, for the bundled workload).
for plugin in plugins/*/; do
  [ -f "$plugin/pyproject.toml" ] || continue
  if [ "${1:-}" = "--test" ] && grep -q '^test = ' "$plugin/pyproject.toml"; then
    pip_install -e "${plugin%/}[test]"
  elif [ "${1:-}" != "--test" ] && grep -q '^pocl = ' "$plugin/pyproject.toml"; then
    pip_install -e "${plugin%/}[pocl]"
  else
    pip_install -e "${plugin%/}"
  fi
  # a plugin's own extra test setup (e.g. polyprof-xpu installs intel-pti without its 1.8 GB runtimes)
  if [ "${1:-}" = "--test" ] && [ -x "$plugin/scripts/ci-setup.sh" ]; then
    "$plugin/scripts/ci-setup.sh" .venv/bin/python
  fi
done
