"""records.decode: cupti-python record objects -> columns, read through each layout's numpy dtype."""

import types

import numpy as np
from polyprof_cuda import records
from polyprof_cuda.records import DRIVER, KERNEL, RUNTIME, _Memory, decode, dtype_name, layout_dtype
from recorded_cupti import make_record, stub_fields


def kernel(cls, name, corr):
    """A kernel record of layout `cls` whose numbers all derive from `corr`."""
    from cupti import cupti

    return make_record(
        cls,
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


def test_dtype_names_follow_cupti_pythons_spelling():
    from cupti import cupti

    assert dtype_name("ActivityMemcpyPtoP4") == "activity_memcpy_pto_p4_dtype"
    assert dtype_name("ActivityAPI") == "activity_api_dtype"
    assert dtype_name("ActivityKernel10") == "activity_kernel10_dtype"
    for cls in stub_fields():
        if cls.startswith("Activity") and isinstance(getattr(cupti, cls, None), type):
            if hasattr(cupti, dtype_name(cls)):
                assert layout_dtype(cupti, getattr(cupti, cls)) is not None


def test_fields_of_two_kernel_layouts_and_both_api_kinds_come_back_as_columns():
    from cupti import cupti

    layouts = sorted(c for c in stub_fields() if c.startswith("ActivityKernel") and c[14:].isdigit())
    old, new = layouts[0], layouts[-1]
    recs = [kernel(old, "gemm", 1), kernel(new, "relu", 2), kernel(new, "gemm", 3)]
    api_calls = [api("RUNTIME", 211, 1), api("DRIVER", 307, 2)]
    cols, problems = decode([recs[:2], api_calls, recs[2:]], families(), cupti)
    assert problems == []
    k = cols[KERNEL]
    order = np.argsort(k["correlation_id"])
    assert k["correlation_id"][order].tolist() == [1, 2, 3]
    assert [k["name"].table[c] for c in k["name"].codes[order]] == ["gemm", "relu", "gemm"]
    assert len(k["name"].table) == 2, "one table entry per distinct name across layouts"
    assert k["grid_x"][order].tolist() == [1, 2, 3] and k["start"][order].tolist() == [1001, 1002, 1003]
    assert k["device_id"].dtype == np.int64 and k["graph_id"].tolist() == [0, 0, 0]
    assert cols[RUNTIME]["cbid"].tolist() == [211] and cols[DRIVER]["cbid"].tolist() == [307]


def test_unaligned_reads_and_layouts_without_a_dtype_give_the_same_columns():
    from cupti import cupti

    cls = sorted(c for c in stub_fields() if c.startswith("ActivityKernel") and c[14:].isdigit())[-1]
    recs = [kernel(cls, f"k{i % 3}", i) for i in range(50)]
    fast, _ = decode([recs], families(), cupti)
    no_dtypes = types.SimpleNamespace()  # a cupti-python that publishes no dtypes: attribute reads
    slow, _ = decode([recs], families(), no_dtypes)
    ptrs = np.array([r.ptr for r in recs], dtype=np.uint64)
    memory = _Memory(ptrs, layout_dtype(cupti, type(recs[0])))
    memory.aligned = False  # the copy-whole-records path
    for field in records.FIELDS[KERNEL]:
        if field == "name":
            names = lambda c: [c.table[i] for i in c.codes]  # noqa: E731
            assert (
                names(fast[KERNEL]["name"]) == names(slow[KERNEL]["name"]) == [f"k{i % 3}" for i in range(50)]
            )
            continue
        assert fast[KERNEL][field].tolist() == slow[KERNEL][field].tolist(), field
        if field in memory.dtype.names:
            assert memory.field(field).tolist() == fast[KERNEL][field].tolist(), field


def test_kinds_not_enabled_are_left_out():
    from cupti import cupti

    recs = [
        kernel(
            sorted(c for c in stub_fields() if c.startswith("ActivityKernel") and c[14:].isdigit())[-1],
            "k",
            1,
        )
    ]
    cols, problems = decode([recs], {int(cupti.ActivityKind.RUNTIME): RUNTIME}, cupti)
    assert cols == {} and problems == []
