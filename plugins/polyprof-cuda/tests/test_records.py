"""Raw CUPTI buffers -> columns: the buffer pool, the walk, and records.decode reading each kind's
fields through cupti-python's numpy dtypes. Buffers hold the records' real C structs, laid out as CUPTI
lays them out (tests/recorded_cupti.FakeLibCupti)."""

import types

import numpy as np
import pytest
from polyprof_cuda import records
from polyprof_cuda.raw_buffers import BufferPool
from polyprof_cuda.records import (
    DRIVER,
    KERNEL,
    RUNTIME,
    _layout_problem,
    _Memory,
    decode,
    newest_layouts,
)
from recorded_cupti import FakeLibCupti, dtype_name, latest_class, layout_dtype, make_record, stub_fields

from polyprof.plugin.records import walk_tagged_records as walk


def kernel(name, corr):
    """A kernel record of the newest layout whose numbers all derive from `corr`."""
    from cupti import cupti

    return make_record(
        latest_class("ActivityKernel"),
        kind=int(cupti.ActivityKind.CONCURRENT_KERNEL),
        name=name,
        start=1000 + corr,
        end=2000 + corr,
        device_id=corr % 2,
        correlation_id=corr,
        registers_per_thread=32,
        grid_x=corr,
        grid_y=2,
        grid_z=3,
    )


def api(kind_name, cbid, corr):
    from cupti import cupti

    kind = int(getattr(cupti.ActivityKind, kind_name))
    return make_record("ActivityAPI", kind=kind, cbid=cbid, start=5, end=6, thread_id=9, correlation_id=corr)


def families():
    from cupti import cupti

    return {
        int(cupti.ActivityKind.CONCURRENT_KERNEL): KERNEL,
        int(cupti.ActivityKind.RUNTIME): RUNTIME,
        int(cupti.ActivityKind.DRIVER): DRIVER,
    }


class Delivered:
    """Record lists as CUPTI would deliver them: one or more raw buffers per list, in a pool."""

    def __init__(self, *lists, buffer_bytes=1 << 16, buffer_limit=None):
        self.lib = FakeLibCupti(types.SimpleNamespace(class_of_kind={}), buffer_limit=buffer_limit)
        self.pool = BufferPool(buffer_bytes, max_bytes=1 << 30)
        self.lib.register_buffer_callbacks(self.pool.requested, self.pool.completed)
        self.walk_calls = 0
        for recs in lists:
            self.lib.deliver(recs)

    def next_record(self, buffer, valid, record):
        self.walk_calls += 1
        return self.lib.next_record(buffer, valid, record)

    def decode(self, kind_family=None, max_records=10**9):
        from cupti import cupti

        return decode(
            self.pool.take(), kind_family or families(), newest_layouts(cupti), self.next_record, max_records
        )


def test_dtype_names_follow_cupti_pythons_spelling():
    from cupti import cupti

    assert dtype_name("ActivityMemcpyPtoP4") == "activity_memcpy_pto_p4_dtype"
    assert dtype_name("ActivityAPI") == "activity_api_dtype"
    assert dtype_name("ActivityKernel10") == "activity_kernel10_dtype"
    for cls in stub_fields():
        if cls.startswith("Activity") and isinstance(getattr(cupti, cls, None), type):
            if hasattr(cupti, dtype_name(cls)):
                assert layout_dtype(cupti, getattr(cupti, cls)) is not None


def test_newest_layouts_take_the_highest_version_in_either_spelling():
    """cupti-python 13 names dtypes activity_kernel10_dtype, 12.8 c_upti_activity_kernel9_dtype."""
    old, new, api_dtype = (np.dtype([(f, np.int64) for f in names]) for names in (["a"], ["b"], ["c"]))
    module = types.SimpleNamespace(
        c_upti_activity_kernel9_dtype=old,
        activity_kernel10_dtype=new,
        activity_memcpy_pto_p4_dtype=old,
        c_upti_activity_api_dtype=api_dtype,
        activity_kernel_note="not a dtype",
    )
    found = newest_layouts(module)
    assert found[KERNEL] == ("activity_kernel10_dtype", new)
    assert found[RUNTIME] == found[DRIVER] == ("c_upti_activity_api_dtype", api_dtype)
    assert records.MEMCPY not in found, "the peer-copy layout is not the plain copy's"
    assert found[records.MEMCPY_P2P][1] is old


def test_fields_of_kernels_and_both_api_kinds_come_back_as_columns_across_buffers():
    recs = [kernel("gemm", 1), kernel("relu", 2), kernel("gemm", 3)]
    api_calls = [api("RUNTIME", 211, 1), api("DRIVER", 307, 2)]
    delivered = Delivered(recs[:2], api_calls, recs[2:])
    got = delivered.decode()
    assert got.problems == [] and got.records == 5 and got.over_cap == 0
    k = got.columns[KERNEL]
    order = np.argsort(k["correlation_id"])
    assert k["correlation_id"][order].tolist() == [1, 2, 3]
    assert [k["name"].table[c] for c in k["name"].codes[order]] == ["gemm", "relu", "gemm"]
    assert len(k["name"].table) == 2, "one table entry per distinct name across buffers"
    assert k["grid_x"][order].tolist() == [1, 2, 3] and k["start"][order].tolist() == [1001, 1002, 1003]
    assert k["device_id"].dtype == np.int64 and k["graph_id"].tolist() == [0, 0, 0]
    assert got.columns[RUNTIME]["cbid"].tolist() == [211] and got.columns[DRIVER]["cbid"].tolist() == [307]


def test_the_walk_asks_cupti_once_per_kind_and_finds_every_record_in_order():
    recs = [kernel(f"k{i}", i) if i % 3 else api("RUNTIME", 211, i) for i in range(30)]
    delivered = Delivered(recs)
    ((buffer, valid),) = delivered.pool.take()
    sizes = {}
    kinds, offsets = walk(buffer, valid, sizes, delivered.next_record)
    assert kinds.tolist() == [int(r.kind) for r in recs]
    assert delivered.walk_calls == 2, "one size lookup per kind, then arithmetic"
    assert offsets[0] == 0 and np.all(np.diff(offsets) > 0) and np.all(offsets % 8 == 0)
    again = walk(buffer, valid, sizes, delivered.next_record)
    assert delivered.walk_calls == 2 and again[1].tolist() == offsets.tolist(), (
        "sizes carried to the next buffer"
    )


def test_many_small_buffers_give_what_one_big_buffer_gives():
    recs = [kernel(f"k{i % 4}", i) for i in range(40)]
    small = Delivered(recs, buffer_limit=1000)
    assert small.lib.delivered_buffers > 5
    one, many = Delivered(recs).decode(), small.decode()
    for field in records.FIELDS[KERNEL]:
        if field != "name":
            assert one.columns[KERNEL][field].tolist() == many.columns[KERNEL][field].tolist(), field
    names = lambda c: [c.table[i] for i in c.codes]  # noqa: E731
    assert names(one.columns[KERNEL]["name"]) == names(many.columns[KERNEL]["name"])


def test_records_past_the_cap_are_counted_not_read():
    recs = [kernel("k", i) for i in range(10)]
    got = Delivered(recs[:4], recs[4:]).decode(max_records=6)
    assert got.records == 6 and got.over_cap == 4
    assert got.columns[KERNEL]["correlation_id"].tolist() == [0, 1, 2, 3, 4, 5], "the first ones are kept"


def test_unaligned_reads_give_the_same_columns():
    from cupti import cupti

    recs = [kernel(f"k{i % 3}", i) for i in range(50)]
    delivered = Delivered(recs)
    ((buffer, valid),) = delivered.pool.take()
    _, offsets = walk(buffer, valid, {}, delivered.next_record)
    shifted = np.zeros(len(buffer) + 8, dtype=np.uint8)  # the same records, 4 bytes off alignment
    shifted[4 : 4 + valid] = buffer[:valid]
    dtype = newest_layouts(cupti)[KERNEL][1]
    aligned, unaligned = _Memory(buffer, offsets, dtype), _Memory(shifted, offsets + 4, dtype)
    assert aligned.aligned and not unaligned.aligned  # the copy-whole-records path
    for field in records.FIELDS[KERNEL]:
        if field in dtype.names:
            assert unaligned.field(field).tolist() == aligned.field(field).tolist(), field
    assert aligned.field("correlation_id").tolist() == list(range(50))


def test_kinds_not_enabled_are_left_out():
    from cupti import cupti

    got = Delivered([kernel("k", 1)]).decode({int(cupti.ActivityKind.RUNTIME): RUNTIME})
    assert got.columns == {} and got.problems == []


def test_records_smaller_than_cupti_pythons_layout_are_refused_in_words():
    from cupti import cupti

    name, dtype = newest_layouts(cupti)[KERNEL]
    assert _layout_problem(KERNEL, (name, dtype), dtype.itemsize) == ""
    assert _layout_problem(KERNEL, (name, dtype), None) == "", "a lone last record: size unknown"
    problem = _layout_problem(KERNEL, (name, dtype), dtype.itemsize - 16)
    assert f"libcupti writes kernel records of {dtype.itemsize - 16} bytes" in problem and name in problem
    assert "no record layout" in _layout_problem(KERNEL, None, None)


def test_pool_reuses_empty_buffers_keeps_filled_ones_and_drops_past_its_memory_cap():
    pool = BufferPool(buffer_bytes=4096, max_bytes=5000)
    a, size = pool.requested()
    assert size == 4096 and a % 8 == 0 and pool.lent == 1
    pool.completed(a, 0)
    assert pool.requested()[0] == a, "an empty buffer is lent again"
    pool.completed(a, 4000)
    b, _ = pool.requested()
    c, _ = pool.requested()
    assert b != a and pool.lent == 2
    pool.completed(b, 4000)  # 4,000 kept < 5,000: kept, though it goes past the cap
    pool.completed(c, 100)  # 8,000 kept: dropped
    assert (pool.dropped_buffers, pool.dropped_bytes) == (1, 100)
    pool.completed(12345, 10)
    assert pool.unknown_buffers == 1
    kept = pool.take()
    assert [valid for _, valid in kept] == [4000, 4000] and kept[0][0].ctypes.data == a
    assert pool.take() == [] and pool.lent == 0


@pytest.mark.parametrize("valid", [0, 8])
def test_walk_of_an_empty_or_one_record_buffer(valid):
    buffer = np.zeros(64, dtype=np.uint8)
    buffer[:4] = [7, 0, 0, 0]
    kinds, offsets = walk(buffer, valid, {}, lambda b, v, r: None)
    assert kinds.tolist() == ([7] if valid else []) and offsets.tolist() == ([0] if valid else [])


@pytest.mark.parametrize("speedups", ["c", "python"])
def test_the_c_and_python_walks_agree_and_stop_at_kinds_of_unknown_size(monkeypatch, speedups):
    import polyprof._native as native
    from polyprof._native import python as python_side

    if speedups == "python":
        monkeypatch.setattr(native, "walk_tagged_records", python_side.walk_tagged_records)
    elif native.extension is None:
        pytest.skip("polyprof's C extension is not built here")
    # records of kinds 3 (16 bytes), 5 (24 bytes) and 2000 (8 bytes: past the size table)
    layout = [(3, 16), (5, 24), (3, 16), (2000, 8), (5, 24), (2000, 8), (3, 16)]
    buffer = np.zeros(256, dtype=np.uint8)
    offsets, at = [], 0
    for kind, size in layout:
        buffer[at : at + 4] = np.frombuffer(np.uint32(kind).tobytes(), dtype=np.uint8)
        offsets.append(at)
        at += size
    valid = at
    size_of = dict(layout)
    asked = []

    def next_record(base, valid_bytes, record):
        kind = int(np.frombuffer(buffer[record - base : record - base + 4].tobytes(), np.uint32)[0])
        asked.append(kind)
        following = record + size_of[kind]
        return following if following < base + valid_bytes else None

    sizes = {}
    kinds, found = walk(buffer, valid, sizes, next_record)
    assert kinds.tolist() == [k for k, _ in layout] and found.tolist() == offsets
    assert asked == [3, 5, 2000, 2000], "each kind once; a kind past the table each time"
    assert sizes == {3: 16, 5: 24, 2000: 8}
