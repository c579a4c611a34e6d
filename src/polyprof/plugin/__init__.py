"""Everything a backend may use, in one public module. Plugins import from here and nowhere else in
polyprof (the in-tree ones do too; a test checks it)::

    from polyprof.plugin import (
        API_VERSION, ActivityKind, Availability, SessionBase, Sink, ClockPairs, Option, OptionSchema,
    )

What is here, by job:

- the contract: :data:`API_VERSION`, :class:`Availability`, :class:`ProfileConfig`,
  :class:`SessionContext` (clock, ids, window, options, ``report``, facilities), :class:`SessionBase`,
  the :class:`Backend`/:class:`Session` protocols, :func:`contract_problems`, and what a backend or
  session may declare beyond it: :class:`BackendTraits`, :class:`SessionTraits`;
- handing rows over: :class:`Sink` (one strict schema, :data:`ROW_COLUMNS`), :class:`ActivityKind`,
  :data:`DEFAULT_CATEGORY`, flow types, :class:`CodedStrings`, :class:`ArgColumns`, :class:`JSONColumn`;
- clocks: :func:`host_ns`, :class:`ClockMapping`, :class:`ClockPair`, :class:`ClockPairs`,
  :func:`sample_clock_pair`;
- options: :class:`Option`, :class:`OptionSchema` (declared by a backend, checked by the engine);
- shared vendor facilities: :mod:`polyprof.plugin.facilities` (:data:`CUPTI`), through ``ctx.hold_facility``
  and ``ctx.facility_holder``;
- the host operation open where work is launched: :func:`current_external_id` and
  :func:`external_id_reader` (its C function, for interceptors written in C), :func:`current_external_id_var`;
- errors: :class:`ConfigError`, :class:`BackendContractError`, :class:`SinkClosedError`.

Helpers for some kinds of backend live beside it: :mod:`polyprof.plugin.records` for vendors that
hand over buffers of records (walking tagged records, coding strings, demangling kernel names), and
:mod:`polyprof.plugin.counters` for counter samplers (the sampler thread, a per-GPU counter session
and the backend half they share).

``docs/writing-a-backend.md`` walks through a whole backend; ``polyprof.testing.conformance`` checks one.
"""

from __future__ import annotations

from contextvars import ContextVar

from polyprof._lazy import lazy_names

#: each public name -> the module of this package (or the model, or the errors) that owns it: loaded on
#: first use, so that polyprof's own modules importing one part (the Sink, the clock) load only that
_OWNERS = {
    **dict.fromkeys(("API_VERSION", "OPTIONAL_SESSION_METHODS", "REQUIRED_SESSION_METHODS", "Availability",
                     "Backend", "ProfileConfig", "Reporter", "Session", "SessionBase", "SessionContext",
                     "contract_problems"), "polyprof.plugin.backend"),
    **dict.fromkeys(("ClockMapping", "ClockPair", "ClockPairs", "host_ns", "sample_clock_pair"), "polyprof.plugin.clock"),
    **dict.fromkeys(("BackendContractError", "ConfigError", "SinkClosedError"), "polyprof.errors"),
    "CUPTI": "polyprof.plugin.facilities",
    **dict.fromkeys(("DEFAULT_CATEGORY", "FLOW_AC2G", "FLOW_FWDBWD", "FLOW_NONE", "ActivityKind", "ArgColumns",
                     "CodedStrings", "JSONColumn"), "polyprof.model"),
    **dict.fromkeys(("Option", "OptionSchema"), "polyprof.plugin.options"),
    "Sink": "polyprof.plugin.sink",
    **dict.fromkeys(("OPTIONAL_COLUMNS", "REQUIRED_COLUMNS", "ROW_COLUMNS"), "polyprof.plugin.sink_rows"),
    **dict.fromkeys(("BackendTraits", "SessionTraits"), "polyprof.plugin.traits"),
    **dict.fromkeys(("current_external_id", "external_id_reader"), "polyprof.plugin.correlation"),
}
__getattr__, __dir__ = lazy_names(globals(), _OWNERS)


def current_external_id_var() -> ContextVar[int]:
    """The ContextVar that carries the current external id into asyncio tasks and copied contexts;
    setting it makes an id current (a test standing in for a framework op). Spans opened in plain
    synchronous code do not set it, so read the id with :func:`current_external_id` (Python) or the C
    function at :func:`external_id_reader` (``long long reader(void)``, called with the GIL held)."""
    from polyprof.plugin import correlation

    return correlation.current


__all__ = [
    "API_VERSION",
    "ActivityKind",
    "ArgColumns",
    "Availability",
    "Backend",
    "BackendTraits",
    "BackendContractError",
    "CUPTI",
    "ClockMapping",
    "ClockPair",
    "ClockPairs",
    "CodedStrings",
    "ConfigError",
    "DEFAULT_CATEGORY",
    "FLOW_AC2G",
    "FLOW_FWDBWD",
    "FLOW_NONE",
    "JSONColumn",
    "OPTIONAL_COLUMNS",
    "OPTIONAL_SESSION_METHODS",
    "Option",
    "OptionSchema",
    "ProfileConfig",
    "REQUIRED_COLUMNS",
    "REQUIRED_SESSION_METHODS",
    "ROW_COLUMNS",
    "Reporter",
    "Session",
    "SessionBase",
    "SessionTraits",
    "SessionContext",
    "Sink",
    "SinkClosedError",
    "contract_problems",
    "current_external_id",
    "current_external_id_var",
    "external_id_reader",
    "host_ns",
    "sample_clock_pair",
]
