"""The Sink's one schema: both ways in share columns, defaults and checks; wrong rows are counted,
misuse raises BackendContractError naming the backend."""

import numpy as np
import pytest

from polyprof.errors import BackendContractError, PolyprofError, SinkClosedError
from polyprof.model import DEFAULT_CATEGORY, FLOW_AC2G, FLOW_NONE, ActivityKind, BackendStatus, CodedStrings
from polyprof.plugin.sink import Sink
from polyprof.plugin.sink_rows import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, ROW_COLUMNS


def _sink():
    sink = Sink("mine")
    host = sink.host_device()
    return sink, host, sink.host_thread(7)


def test_a_misspelt_column_is_rejected_with_the_known_ones_named():
    sink, host, t = _sink()
    with pytest.raises(BackendContractError, match=r"unknown column\(s\) \['externalid', 'flow_idd'\]") as err:
        sink.activities({"kind": [0], "name": ["x"], "device": [host], "resource": [t], "start": [1], "end": [2],
                         "flow_idd": [5], "externalid": [9]})
    assert err.value.backend == "mine" and isinstance(err.value, PolyprofError)
    assert all(c in str(err.value) for c in ROW_COLUMNS)
    with pytest.raises(BackendContractError, match=r"needs the column\(s\) \['end'\]"):
        sink.activities({"kind": [0], "name": ["x"], "device": [host], "resource": [t], "start": [1]})
    with pytest.raises(BackendContractError, match="different lengths"):
        sink.activities({"kind": [0, 0], "name": ["x"], "device": [host], "resource": [t], "start": [1], "end": [2]})
    with pytest.raises(TypeError):
        sink.activity(ActivityKind.KERNEL, "k", device=host, resource=t, start=1, end=2, flow_idd=3)


def test_both_ways_in_give_the_same_rows_with_the_same_defaults():
    rows = [
        dict(kind=ActivityKind.RUNTIME, name="launch", start=10, end=20, correlation=5, flow_id=5, flow_start=True),
        dict(kind=ActivityKind.KERNEL, name="k", start=30, end=40, correlation=5, flow_id=5, external_id=3),
        dict(kind=ActivityKind.CPU_OP, name="op", start=1, end=50),
        dict(kind=ActivityKind.USER_ANNOTATION, name="a", start=2, end=3, cat="my_cat", flow_type=1, flow_id=0),
    ]
    one, host, t = _sink()
    for r in rows:
        one.activity(device=host, resource=t, **r)
    many, host, t = _sink()
    columns = {k: [r.get(k) for r in rows] for k in ROW_COLUMNS if any(k in r for r in rows)}
    defaults = {"correlation": 0, "external_id": 0, "flow_id": 0, "flow_start": False}
    for k, v in defaults.items():
        columns[k] = [x if x is not None else v for x in columns[k]]
    columns["cat"] = [c or DEFAULT_CATEGORY[r["kind"]] for c, r in zip(columns["cat"], rows, strict=True)]
    del columns["flow_type"]
    columns.update(device=[host] * 4, resource=[t] * 4)
    many.activities({k: np.array(v) if k not in ("name", "cat") else v for k, v in columns.items()})
    a = one.seal(BackendStatus("mine")).activities
    b = many.seal(BackendStatus("mine")).activities
    assert [r for r in a] == [r for r in b]
    flows = [(r.flow_id, r.flow_type) for r in a]
    assert flows == [(5, FLOW_AC2G), (5, FLOW_AC2G), (0, FLOW_NONE), (0, FLOW_NONE)], "ac2g wherever a flow is"
    assert set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS) == set(ROW_COLUMNS)


def test_wrong_rows_are_counted_in_either_way_in_never_raised():
    sink, host, t = _sink()
    sink.activity(ActivityKind.KERNEL, "late", device=host, resource=t, start=5, end=4)
    sink.activity(ActivityKind.KERNEL, "float", device=host, resource=t, start=1.5, end=4)
    sink.activity(ActivityKind.KERNEL, "nodev", device=9, resource=t, start=1, end=4)
    sink.activity(99, "kind", device=host, resource=t, start=1, end=4)
    kept = sink.activities(
        {"kind": np.zeros(4, np.int64), "name": CodedStrings(np.array([0, 3, 0, 0]), ["a"]),
         "device": np.array([host, host, host, 5]), "resource": np.full(4, t), "start": np.array([1, 1, 5, 1]),
         "end": np.array([2, 2, 4, 2])}
    )
    assert kept == 1
    floats = sink.activities({"kind": [0], "name": ["x"], "device": [host], "resource": [t], "start": np.array([1.0]), "end": [2]})
    assert floats == 0
    part = sink.seal(BackendStatus("mine"))
    assert len(part.activities) == 1
    assert part.status.rejected_reasons == {
        "end before start": 2,
        "invalid kind or timestamp (TypeError)": 1,
        "unknown device": 2,
        "unknown activity kind": 1,
        "name code outside its string table": 1,
        "start is not an integer column (float64)": 1,
    }
    assert part.status.rejected == 8


def test_contract_misuse_raises_naming_the_backend():
    sink, host, t = _sink()
    with pytest.raises(BackendContractError, match="backend 'mine': resource\\(\\): unknown device handle 4"):
        sink.resource(4, 1)
    with pytest.raises(BackendContractError, match="args must be a dict"):
        sink.activity(ActivityKind.KERNEL, "k", device=host, resource=t, start=1, end=2, args="not a dict")
    with pytest.raises(BackendContractError, match="row numbers 0..0"):
        sink.activities({"kind": [0], "name": ["x"], "device": [host], "resource": [t], "start": [1], "end": [2]}, {3: {}})
    part = sink.seal(BackendStatus("mine"))
    assert part.activities["start"].flags.writeable is False, "a sealed part is immutable"
    # a backend's own thread still emitting after its collect returned: counted, never raised there
    sink.activity(ActivityKind.KERNEL, "late", device=host, resource=t, start=1, end=2)
    sink.activities({"kind": [0, 0], "name": ["x", "y"], "device": [host] * 2, "resource": [t] * 2, "start": [1, 2], "end": [2, 3]})
    assert part.status.dropped == {"rows after collect returned": 3} and len(part.activities) == 0
    with pytest.raises(SinkClosedError):  # a sink closed without a status to count on
        closed = Sink("other")
        closed.closed = True
        closed.activity(ActivityKind.KERNEL, "k", device=0, resource=0, start=1, end=2)
