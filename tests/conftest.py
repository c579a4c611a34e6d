import os
import sys

import pytest

from polyprof.registry import Registry

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)


@pytest.fixture
def registry():
    """A registry with the installed entry points (host backend) and nothing from the environment."""
    return Registry(use_env=False)

