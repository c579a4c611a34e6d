#!/usr/bin/env bash
# Run by scripts/setup.sh --test: the real intel-pti wheel (1.8 MB) without its declared dependency
# dpcpp-cpp-rt (~1.8 GB of oneAPI runtimes), so that the tests see what PTI says on a machine
# without an Intel GPU stack.
set -euo pipefail
"$1" -m pip install -q --disable-pip-version-check --no-deps "intel-pti>=1.0" 2> >(grep -v "^WARNING: Location" >&2)
