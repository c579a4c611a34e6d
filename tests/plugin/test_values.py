"""Every value that enters polyprof becomes something the trace can hold, or is rejected and counted:
no value makes stop, merge or export raise, and the written trace loads back (fixed-seed property
tests)."""

import math

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import polyprof
from polyprof.formats import dumps_chrome_trace, load_trace
from polyprof.formats.common.jsonsafe import json_bytes
from polyprof.model import ActivityKind, BackendStatus
from polyprof.plugin.sink import Sink

names = st.one_of(st.text(), st.integers(), st.builds(object), st.binary())
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(), st.binary(),
                    st.builds(object), st.tuples(st.integers()))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                      st.dictionaries(st.one_of(st.text(), st.integers(), st.tuples(st.text())), inner, max_size=3)),
                      max_leaves=8)
SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.filterwarnings("ignore::polyprof.PolyprofWarning")  # the rejections are counted


def _loads_back(trace) -> None:
    data = dumps_chrome_trace(trace)
    orjson.loads(data)  # valid JSON
    load_trace_from(data)


def load_trace_from(data: bytes):
    import os
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        f.write(data)
    try:
        return load_trace(f.name)
    finally:
        os.unlink(f.name)


@seed(20261201)
@SETTINGS
@given(name=names, args=values, instant_args=values, counter=st.one_of(st.integers(), st.floats(), st.text()),
       key=st.text(), meta=values)
def test_user_values_never_cost_the_trace(name, args, instant_args, counter, key, meta):
    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function(name, args if isinstance(args, (dict, str)) or args is None else {"v": args}):
            polyprof.instant(name if isinstance(name, str) else "i", instant_args if isinstance(instant_args, dict) else None)
            polyprof.counter("c", counter)
        with polyprof.record_function("healthy"):
            pass
    prof.add_metadata(key or "k", meta)
    trace = prof.trace
    assert "healthy" in [a.name for a in trace.activities_of(ActivityKind.USER_ANNOTATION)]
    _loads_back(trace)


@seed(20261202)
@SETTINGS
@given(ints=st.lists(st.integers(min_value=-(2**70), max_value=2**70), min_size=1, max_size=6),
       name=st.text(), props=values, args=values)
def test_backend_columns_and_values_are_rejected_per_row_or_made_safe(ints, name, props, args):
    sink = Sink("b")
    host = sink.host_device()
    t = sink.host_thread(1)
    sink.device("d", type="x", properties={"p": props})
    n = len(ints)
    kept = sink.activities(
        {"kind": np.zeros(n, np.int64), "name": [name] * n, "device": [host] * n, "resource": [t] * n,
         "start": [1000 + i for i in range(n)], "end": [2000 + i for i in range(n)], "correlation": ints},
        {0: {"a": args}},
    )
    fits = sum(-(2**63) <= i < 2**63 for i in ints)
    assert kept == fits
    part = sink.seal(BackendStatus("b"))
    assert part.status.rejected == n - fits
    from polyprof.merge import merge

    trace = merge([part], window=(0, 10**6), epoch_offset_ns=0, base_time_ns=0, metadata={"m": props})
    _loads_back(trace)


def test_the_cases_that_lost_whole_traces():
    assert json_bytes({("a", 1): object(), "n": 2**70, "s": "\udc80", "x": float("nan")}).startswith(b'{"(')
    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function("lone \udc80 surrogate", {"obj": object(), (1, 2): "tuple key"}):
            pass
        with polyprof.record_function("fine"):
            pass
        polyprof.counter("too big", 10**400)
    prof.add_metadata("weird", {"set": {1, 2}, "big": 2**100, "inf": math.inf})
    trace = prof.trace
    doc = orjson.loads(dumps_chrome_trace(trace))
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
    assert names == ["lone \ufffd surrogate", "fine"]
    assert doc["weird"] == {"set": [1, 2], "big": str(2**100), "inf": None}
    assert trace.backends["host"].rejected_reasons == {"invalid counter sample": 1}
