"""The one door to polyprof's native code: it chooses, once, at import, between the C extension
(``polyprof._native._speedups``, built from ``_native/csrc/``) and Python, and exports the same names either way.
Nothing else in polyprof imports the extension or asks whether it loaded.

Where the extension is used:

==========================================  ==============================================================
CPython 3.10-3.13 on Linux (x86-64, arm64)  built by ``pip install`` (setup.py; needs a C compiler and
                                            Python's headers) and used
the same, built without a compiler          Python, and ``polyprof backends`` and each trace's host
                                            status say why and how to build it
macOS, Windows, PyPy and other platforms    Python (setup.py does not build it there)
``POLYPROF_PURE_PYTHON=1``                  Python (the suite runs both ways)
==========================================  ==============================================================

What Python means, name by name:

- **the recorder** (``RecordFunction``, ``SpanCall``, ``instant``, ``counter``, the per-thread
  ``EventBuffer``, the process's ids): its twin, :mod:`polyprof._native.twins.recorder`. Users need it
  everywhere, it records the same events, and the suite checks both against each other.
- **the columns' helpers and the writers' event formatters** (``format_activities`` and
  ``format_arg_objects`` for Chrome JSON, ``slice_events`` for Perfetto's tracks): their twins, :mod:`polyprof._native.twins.columns` and
  :mod:`polyprof._native.twins.writers`, the same bytes; callers never know which ran.
- **the accelerators** (the merge's passes, the other writers' encoders, the readers' scanners and the
  rank merge's rewriters): they decline (None, or :data:`DECLINED` for a scanner), as C itself
  declines input it does not take, and the caller runs its reference path (numpy for the merge,
  the Python formatters and orjson for the writers, orjson and ijson for the readers). Same results,
  slower.
- **the Python call tracer** (``pytrace_*``, behind ``with_stack`` and the ``python`` backend) has no
  Python path: :func:`unavailable` says so before it is asked for.

::

    from polyprof import _native

    _native.next_id()                       # either way
    rows = _native.ordered_rows(order, mask)
    if rows is None:                        # declined: the numpy reference path
        rows = order[mask[order]]
"""

from __future__ import annotations

from polyprof._native import load
from polyprof._native.shared import (
    COUNTER,
    DECLINED,
    FIELDS,
    GC,
    INSTANT,
    RECORDER_NAMES,
    SIDE_NAMES,
    SPAN,
    NeedsExtension,
    Routed,
    open_states,
    snapshot,
)

if load.extension is not None:
    try:
        import polyprof._native.c  # noqa: F401 - the adapters take every name they need from the extension
    except AttributeError as exc:  # built from older sources than this polyprof's
        load.reject(
            f"polyprof's C extension is older than its Python code ({exc}); reinstall polyprof to rebuild it"
        )
if load.extension is not None:
    from polyprof._native.c import *  # noqa: F403
else:
    from polyprof._native.python import *  # noqa: F403

from polyprof._native.load import BUILT_HERE, extension, extension_missing, why_pure  # noqa: E402 - as chosen


def description() -> str:
    """Which recorder takes spans, instants and counters: ``C (polyprof._native._speedups)`` or
    ``pure Python (<why, and what to do>)``."""
    return "C (polyprof._native._speedups)" if why_pure is None else f"pure Python ({why_pure})"


def unavailable(feature: str) -> str | None:
    """None where `feature` (one needing the extension) can run; otherwise why not, for the user."""
    return (
        None if why_pure is None else f"{feature} needs polyprof's C extension, not in use here: {why_pure}"
    )


__all__ = [
    "BUILT_HERE", "COUNTER", "DECLINED", "FIELDS", "GC", "INSTANT", "SPAN", "NeedsExtension", "Routed", "open_states", "snapshot",
    "RECORDER_NAMES", "SIDE_NAMES",
    "description", "extension", "extension_missing", "unavailable", "why_pure", *SIDE_NAMES,
]
