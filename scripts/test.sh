#!/usr/bin/env bash
# Quickstart, tests: set up and run the whole suite (lint, core tests, every plugin's tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check .
suites=(tests)
for plugin in plugins/*/; do
  [ -d "$plugin/tests" ] && suites+=("$plugin/tests")
done
.venv/bin/python -m pytest -q "${suites[@]}" "$@"
