"""The torch backend object, found through the entry point ``polyprof.backends.torch.backend:backend``
(the package docstring says what it records)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from polyprof.backends.torch.versions import MIN_TORCH, torch_version
from polyprof.plugin.backend import API_VERSION, Availability, ProfileConfig, SessionContext
from polyprof.plugin.options import OptionSchema
from polyprof.plugin.traits import BackendTraits


class TorchBackend:
    """PyTorch operators (activity group CPU)."""

    name = "torch"
    api_version = API_VERSION
    activities = frozenset({"CPU"})
    options = OptionSchema()  # none: an unknown key is an error, not ignored
    traits = BackendTraits(in_process=True)  # polyprof's own: probe and create_session are called directly, without a guard thread

    def probe(self) -> Availability:
        torch = sys.modules.get("torch")
        if torch is not None:
            version = getattr(torch, "__version__", "?")
            if torch_version(torch) < MIN_TORCH:
                return Availability.no(f"torch {version} is older than 2.4, the oldest this backend supports")
            return Availability.yes(devices=["aten operators"], torch=version)
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return Availability.no(
                "torch is not installed (pip install torch) - aten operators are not recorded"
            )
        return Availability.yes(devices=["aten operators (once the program imports torch)"])

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> Any:
        from polyprof.backends.torch.session import TorchSession

        return TorchSession(config, ctx)


backend = TorchBackend()
