"""pytest plugin (entry point ``pytest11``): the ``polyprof_conformance`` fixture."""

from __future__ import annotations

import pytest

from polyprof.testing.conformance import check_backend


@pytest.fixture
def polyprof_conformance():
    """``polyprof_conformance(backend, workload=...) -> ConformanceReport``."""
    return check_backend
