"""The C call-through recorder (polyprof_opencl._intercept) the plugin wraps pyopencl's enqueue functions with."""

import pytest
from polyprof_opencl.intercept import (
    FIELDS,
    MODE_ARGS_1_2_3,
    MODE_FALLBACK,
    MODE_NBYTES_OF_ARG,
    CallColumns,
    interceptor,
)

from polyprof.plugin import current_external_id_var

pytestmark = pytest.mark.skipif(
    interceptor(print, None, CallColumns(), mode=0, fallback=lambda a, k: (0, 0, 0)) is None,
    reason="polyprof-opencl's C interceptor is not built here (or POLYPROF_PURE_PYTHON is set)",
)


class Payload:
    nbytes = 4096


def target(queue, a=None, b=None, c=None, hostbuf=None, fail=False):
    if fail:
        raise ValueError("bad argument")
    return ("mapped", "event")


def make(mode, **kw):
    cols = CallColumns()
    fn = interceptor(
        target, "SPEC", cols, mode=mode, fallback=lambda args, kwargs: ("fb", len(args), sorted(kwargs)), **kw
    )
    return cols, fn


def rows(cols, columns):
    return [dict(zip(FIELDS, r, strict=True)) for r in cols.rows(columns)]


def test_calls_go_straight_through_when_not_recording():
    cols, fn = make(MODE_ARGS_1_2_3)
    assert fn("q", 1, 2, 3) == ("mapped", "event")
    assert fn.__wrapped__ is target and fn.__polyprof_original__ is target
    assert cols.holder[0] is None


def test_records_timing_thread_external_id_and_args():
    import threading

    cols, fn = make(MODE_ARGS_1_2_3)
    columns = cols.begin()
    token = current_external_id_var().set(77)
    try:
        fn("queue-0", "kernel", (64,), None)
    finally:
        current_external_id_var().reset(token)
    fn(queue="queue-1", a="k", b=(1,), c=(1,))  # keywords: the fallback decides a, b, c
    (r1, r2) = rows(cols, columns)
    assert r1["spec"] == "SPEC" and r1["queue"] == "queue-0" and r1["event"] == "event"
    assert r1["end"] >= r1["start"] > 0 and r1["tid"] == threading.get_native_id()
    assert r1["external_id"] == 77 and r1["error"] == ""
    assert (r1["a"], r1["b"], r1["c"]) == ("kernel", (64,), None)
    assert r2["queue"] == "queue-1" and (r2["a"], r2["b"], r2["c"]) == ("fb", 0, ["a", "b", "c", "queue"])
    cols.end()
    fn("q", 1, 2, 3)
    assert len(cols.rows(columns)) == 2, "nothing recorded after end()"


def test_nbytes_mode_and_exceptions_pass_through_unchanged():
    cols, fn = make(MODE_NBYTES_OF_ARG, pos=4, kw_name="hostbuf")
    columns = cols.begin()
    fn("q", None, None, None, Payload())
    fn("q", hostbuf=Payload())
    with pytest.raises(ValueError, match="bad argument"):
        fn("q", fail=True)
    r = rows(cols, columns)
    assert [x["a"] for x in r[:2]] == [4096, 4096]
    assert r[2]["error"] == "ValueError: bad argument" and r[2]["event"] is None


def test_results_of_the_handle_type_are_replaced():
    class Nanny(str):
        int_ptr = 1234

    def returns_nanny(queue):
        return Nanny("x")

    cols = CallColumns()
    fn = interceptor(
        returns_nanny,
        "S",
        cols,
        mode=MODE_FALLBACK,
        fallback=lambda a, k: (None, None, None),
        handle_type=Nanny,
        plain_event=lambda ptr, retain: ("plain", ptr, retain),
    )
    columns = cols.begin()
    fn("q")
    assert rows(cols, columns)[0]["event"] == ("plain", 1234, True)


def test_a_broken_fallback_never_reaches_the_caller():
    cols = CallColumns()
    fn = interceptor(target, "S", cols, mode=MODE_FALLBACK, fallback=lambda a, k: 1 / 0)
    columns = cols.begin()
    assert fn("q") == ("mapped", "event")
    assert rows(cols, columns)[0]["a"] is None



def test_records_past_a_chunk_keep_every_field_and_let_their_objects_go_with_them():
    import gc
    import weakref

    class Queue:
        pass

    cols, fn = make(MODE_ARGS_1_2_3)
    records = cols.begin()
    queues = [Queue() for _ in range(3)]
    n = 2_500  # past two chunks of 1,024 records
    for i in range(n):
        fn(queues[i % 3], f"kernel-{i}", (i,), None)
    cols.end()
    records.append(("PY", None, None, 2**62, 2**62 + 5, 7, 2**40, "Err: x", 1, None, None))  # the Python wrappers' way
    got = rows(cols, records)
    assert len(got) == len(records) == n + 1
    assert [r["a"] for r in got[:n]] == [f"kernel-{i}" for i in range(n)]
    assert all(r["queue"] is queues[i % 3] and r["b"] == (i,) and r["c"] is None for i, r in enumerate(got[:n]))
    assert all(0 < r["start"] <= r["end"] and r["error"] == "" for r in got[:n])
    assert got[n] == dict(zip(FIELDS, ("PY", None, None, 2**62, 2**62 + 5, 7, 2**40, "Err: x", 1, None, None), strict=True))
    assert [r["event"] for r in got[:2]] == ["event", "event"]
    watched = weakref.ref(queues[0])
    del queues, got
    gc.collect()
    assert watched() is not None, "the records hold their queues"
    del records
    gc.collect()
    assert watched() is None, "and let them go with the records"
