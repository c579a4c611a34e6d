"""What the torch and python backends attach to a trace for the torch-side view of it
(:mod:`polyprof.profiler.torch_view`: ``prof.events()``, ``key_averages()``) to read, named once for
both sides::

    trace.attachments.get(PYTHON_CALLS)      # the python backend's call table (with_stack)
    trace.attachments.get(TORCH_RESULT)      # torch's own profiler result, where its collector ran
    args.get(OVERLOAD_ARG)                   # an operator's overload name (capture_overload_names)
"""

from __future__ import annotations

from typing import NamedTuple

#: the python backend's table of calls (a PythonCallTable)
PYTHON_CALLS = "python.calls"
#: a call's kind in that table, as torch's tracer writes ``is_c``
PY_CALL, PY_C_CALL, PY_MODULE_CALL = 0, 1, 2
#: torch's own profiler result, attached where the torch backend recorded through torch's collector
TORCH_RESULT = "torch.profiler_result"
#: the arg an operator's overload name is recorded under
OVERLOAD_ARG = "Overload Name"


class Site(NamedTuple):
    """Where a call is: torch's ``_PyFrameState`` fields."""

    file_name: str
    function_name: str
    line_number: int
