import os
import sys

import pytest

from polyprof.engine.registry import Registry

HERE = os.path.dirname(__file__)
# the helpers here (fake_backends, docs_blocks, ...) and each folder's test modules, whose helpers the
# tests of another folder import by name (test_store's synthetic job, test_distributed's namespaces)
for _folder in sorted(e.path for e in os.scandir(HERE) if e.is_dir() and e.name not in ("frameworks", "__pycache__")):
    sys.path.insert(0, _folder)
sys.path.insert(0, HERE)


@pytest.fixture
def registry():
    """A registry with the installed entry points (host backend) and nothing from the environment."""
    return Registry(use_env=False)



@pytest.fixture(scope="session")
def install_profiles(tmp_path_factory):
    """polyprof installed as pip installs it, one fresh environment per profile (tests/install_profiles.py)."""
    from install_profiles import Profiles, skip_reason

    if skip_reason():
        pytest.skip(skip_reason())
    return Profiles(tmp_path_factory.mktemp("install-profiles"))
