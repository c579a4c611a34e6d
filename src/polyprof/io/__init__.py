"""Readers: load Chrome traces (polyprof's own and torch.profiler's) back into the model."""

from polyprof.io.chrome import load_trace

__all__ = ["load_trace"]
