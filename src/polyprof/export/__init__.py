"""Writers: Chrome trace JSON (Kineto dialect)."""

from polyprof.export.chrome import dumps_chrome_trace, write_chrome_trace
from polyprof.export.paths import check_output_path

__all__ = ["check_output_path", "dumps_chrome_trace", "write_chrome_trace"]
