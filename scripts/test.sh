#!/usr/bin/env bash
# Quickstart, tests: set up and run the whole suite (lint, the documentation site, core tests, every
# plugin's tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check .
# a broken link or a page missing from the navigation fails the build
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
suites=(tests)
for plugin in plugins/*/; do
  [ -d "$plugin/tests" ] && suites+=("$plugin/tests")
done
.venv/bin/python -m pytest -q "${suites[@]}" "$@"
