"""The ``polyprof`` command line."""
