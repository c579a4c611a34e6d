"""The trace model: columnar activities, devices, resources, counters, metadata.

Nothing in this package knows any backend or device type.
"""

from polyprof._native.shared import FLOW_AC2G, FLOW_FWDBWD, FLOW_NAMES, FLOW_NONE
from polyprof.model.activities import (
    COLUMN_NAMES,
    COLUMNS,
    HOST_TIME_LIMIT_NS,
    TRACE_TIME_LIMIT_NS,
    Activity,
    ActivityBuilder,
    ActivityTable,
    CodedStrings,
)
from polyprof.model.args import ArgColumns, Args, JSONColumn
from polyprof.model.collected import CollectedPart
from polyprof.model.counters import COUNTER_COLUMNS, Counters, CounterSample
from polyprof.model.devices import HOST_DEVICE_KEY, Device, Resource
from polyprof.model.kinds import DEFAULT_CATEGORY, DEVICE_KINDS, ActivityKind, kind_from_category
from polyprof.model.status import BACKEND_FAILED, BACKEND_RAN, BACKEND_UNAVAILABLE, BackendStatus
from polyprof.model.strings import StringTable
from polyprof.model.trace import Trace

__all__ = [
    "ArgColumns",
    "Args",
    "JSONColumn",
    "Activity",
    "ActivityBuilder",
    "ActivityKind",
    "ActivityTable",
    "BACKEND_FAILED",
    "BACKEND_RAN",
    "BACKEND_UNAVAILABLE",
    "BackendStatus",
    "COLUMNS",
    "COLUMN_NAMES",
    "HOST_TIME_LIMIT_NS",
    "TRACE_TIME_LIMIT_NS",
    "COUNTER_COLUMNS",
    "CollectedPart",
    "CodedStrings",
    "CounterSample",
    "Counters",
    "DEFAULT_CATEGORY",
    "DEVICE_KINDS",
    "Device",
    "FLOW_AC2G",
    "FLOW_FWDBWD",
    "FLOW_NAMES",
    "FLOW_NONE",
    "HOST_DEVICE_KEY",
    "Resource",
    "StringTable",
    "Trace",
    "kind_from_category",
]
