"""Writers: Chrome trace JSON (Kineto dialect) and Perfetto's native protobuf, chosen by the path."""

from polyprof.export.chrome import dumps_chrome_trace, write_chrome_trace
from polyprof.export.formats import format_of, write_trace
from polyprof.export.paths import check_output_path
from polyprof.export.perfetto import dumps_perfetto_trace, write_perfetto_trace

__all__ = [
    "check_output_path",
    "dumps_chrome_trace",
    "dumps_perfetto_trace",
    "format_of",
    "write_chrome_trace",
    "write_perfetto_trace",
    "write_trace",
]
