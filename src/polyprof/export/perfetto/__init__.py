"""Perfetto's native protobuf trace format: the writer (:mod:`.writer`), the slice order it needs
(:mod:`.order`), the wire format (:mod:`.wire`) and the proto field numbers (:mod:`.fields`)."""

from polyprof.export.perfetto.writer import dumps_perfetto_trace, write_perfetto_trace

__all__ = ["dumps_perfetto_trace", "write_perfetto_trace"]
