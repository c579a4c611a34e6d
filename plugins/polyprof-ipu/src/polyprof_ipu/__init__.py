"""polyprof-ipu: Graphcore IPUs on polyprof's timeline, read after the run from the ``profile.pop``
Poplar writes, through the PopVision Analysis library (:mod:`.ipu_backend`). Importing this package
imports nothing of the Poplar SDK."""

__version__ = "0.1.0"
