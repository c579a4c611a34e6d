import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

try:
    import cupti  # noqa: F401

    HAVE_CUPTI, WHY = True, ""
except Exception as exc:  # not installed, or libcupti missing
    HAVE_CUPTI, WHY = False, f"needs cupti-python installed (its records and stubs): {exc}"


def pytest_collection_modifyitems(config, items):
    if HAVE_CUPTI:
        return
    skip = pytest.mark.skip(reason=WHY)
    for item in items:
        if "polyprof-cuda" in str(item.fspath):
            item.add_marker(skip)
