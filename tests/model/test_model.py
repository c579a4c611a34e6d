import numpy as np
import pytest

from polyprof.model import (
    FLOW_AC2G,
    ActivityBuilder,
    ActivityKind,
    ActivityTable,
    CodedStrings,
    StringTable,
    kind_from_category,
)


def test_string_table_interns_each_string_once():
    t = StringTable()
    assert [t.intern(s) for s in ["a", "b", "a", "c", "b"]] == [0, 1, 0, 2, 1]
    assert len(t) == 3 and t[2] == "c"


def test_builder_stores_columns_not_objects():
    b = ActivityBuilder()
    b.append(ActivityKind.KERNEL, "kernel", "k1", 1, 0, 10, 25, correlation=5, flow_id=5, flow_type=FLOW_AC2G)
    b.append(ActivityKind.KERNEL, "kernel", "k1", 1, 0, 30, 40, args={"grid": [1, 2, 3]})
    t = b.freeze()
    assert t["start"].dtype == np.int64 and list(t["start"]) == [10, 30]
    assert t["name"][0] == t["name"][1] and t.strings[int(t["name"][0])] == "k1"  # one string for both rows
    assert t.row(1).args == {"grid": [1, 2, 3]} and t.row(0).args == {}
    assert t.row(0).duration == 15 and t.row(0).flow_id == 5


def test_take_keeps_args_with_their_rows():
    b = ActivityBuilder()
    for i in range(5):
        b.append(
            ActivityKind.CPU_OP, "cpu_op", f"op{i}", 0, 0, i, i + 1, args={"i": i} if i % 2 == 0 else None
        )
    t = b.freeze().take(np.array([4, 1, 2]))
    assert [r.name for r in t] == ["op4", "op1", "op2"]
    assert [r.args for r in t] == [{"i": 4}, {}, {"i": 2}]
    none = b.freeze().take(np.array([], dtype=np.int64))
    assert len(none) == 0 and not none.args, "taking no rows takes no args"


def test_concat_remaps_strings_devices_resources_and_flows():
    a = ActivityBuilder()
    a.append(ActivityKind.KERNEL, "kernel", "x", 0, 0, 1, 2, flow_id=3, flow_type=FLOW_AC2G)
    b = ActivityBuilder()
    b.append(ActivityKind.KERNEL, "kernel", "y", 0, 1, 5, 6, flow_id=3, flow_type=FLOW_AC2G, args={"k": 1})
    merged = ActivityTable.concat(
        [
            (a.freeze(), np.array([2]), np.array([4]), 0),
            (b.freeze(), np.array([3]), np.array([9, 8]), 100),
        ]
    )
    rows = list(merged)
    assert [r.name for r in rows] == ["x", "y"]
    assert [r.device for r in rows] == [2, 3] and [r.resource for r in rows] == [4, 8]
    assert [r.flow_id for r in rows] == [3, 103], "flow ids of the second backend are shifted"
    assert rows[1].args == {"k": 1}


def test_extend_columns_defaults_optional_columns():
    b = ActivityBuilder()
    b.extend_columns(
        {
            "kind": [3, 3],
            "cat": ["kernel"] * 2,
            "name": ["a", "b"],
            "device": [0, 0],
            "resource": [0, 0],
            "start": np.array([1, 2]),
            "end": np.array([3, 4]),
        },
        {1: {"x": 1}},
    )
    t = b.freeze()
    assert t["correlation"].tolist() == [0, 0] and t.row(1).args == {"x": 1}


def test_a_tuple_of_two_names_is_two_names_not_codes():
    b = ActivityBuilder()
    b.extend_columns(
        {
            "kind": [3, 3],
            "name": ("a", "b"),
            "cat": ("kernel", "kernel"),
            "device": [0, 0],
            "resource": [0, 0],
            "start": [1, 2],
            "end": [2, 3],
        }
    )
    assert [r.name for r in b.freeze()] == ["a", "b"]


def test_rows_and_column_batches_keep_their_order_and_arg_rows():
    b = ActivityBuilder()
    b.append(ActivityKind.KERNEL, "kernel", "first", device=0, resource=0, start=1, end=2, args={"i": 0})
    b.extend_columns(
        {
            "kind": np.array([0, 0, 0]),
            "name": CodedStrings(np.array([2, 0, 2]), ["aten::mm", "unused", "aten::add"]),
            "cat": ["cpu_op"] * 3,
            "device": np.zeros(3, dtype=np.int64),
            "resource": np.zeros(3, dtype=np.int64),
            "start": np.array([3, 4, 5]),
            "end": np.array([4, 5, 6]),
        },
        {2: {"i": 3}},
    )
    b.append(ActivityKind.KERNEL, "kernel", "last", device=0, resource=0, start=7, end=8)
    assert len(b) == 5
    t = b.freeze()
    assert [r.name for r in t] == ["first", "aten::add", "aten::mm", "aten::add", "last"]
    assert t["start"].tolist() == [1, 3, 4, 5, 7]
    assert t.row(0).args == {"i": 0} and t.row(3).args == {"i": 3} and t.row(1).args == {}


def test_sink_takes_names_as_codes_into_a_table_and_rejects_codes_outside_it():
    from polyprof.plugin.sink import Sink

    sink = Sink("b")
    host = sink.host_device()
    thread = sink.host_thread(1)
    kept = sink.activities(
        {
            "kind": np.zeros(3, dtype=np.int64),
            "name": CodedStrings(np.array([1, 5, 0]), ["aten::mm", "aten::add"]),
            "device": np.full(3, host),
            "resource": np.full(3, thread),
            "start": np.array([1, 2, 3]),
            "end": np.array([2, 3, 4]),
        },
        {2: {"k": "v"}},
    )
    assert kept == 2 and sink.rejected == {"name code outside its string table": 1}
    t = sink.builder.freeze()
    assert [r.name for r in t] == ["aten::add", "aten::mm"] and [r.cat for r in t] == ["cpu_op"] * 2
    assert t.row(1).args == {"k": "v"}


@pytest.mark.parametrize(
    "cat,kind",
    [
        ("cuda_runtime", ActivityKind.RUNTIME),
        ("xpu_driver", ActivityKind.DRIVER),
        ("cuda_sync", ActivityKind.SYNC),
        ("kernel", ActivityKind.KERNEL),
        ("gpu_memcpy", ActivityKind.GPU_MEMCPY),
        ("opencl_runtime", ActivityKind.RUNTIME),
    ],
)
def test_kind_from_category(cat, kind):
    assert kind_from_category(cat) == kind


def test_activity_kind_parse_rejects_unknown_names_with_suggestion():
    assert ActivityKind.parse("kernel") is ActivityKind.KERNEL
    with pytest.raises(ValueError, match="kernel"):
        ActivityKind.parse("kernal")


def test_column_args_read_like_dicts_and_follow_their_rows():
    from polyprof.model import ArgColumns, Args

    args = Args({0: {"error": "x"}, 2: {"stream": 99}})
    args.add_block(
        np.array([2, 1]), ArgColumns(("stream", "grid"), (np.array([7, 8]), [(1, 1, 1), (2, 1, 1)]))
    )
    assert args[1] == {"stream": 8, "grid": (2, 1, 1)} and type(args[1]["stream"]) is int
    assert args[2] == {"stream": 99, "grid": (1, 1, 1)}, "the dict wins on a shared key"
    assert args.rows().tolist() == [0, 1, 2] and len(args) == 3 and 3 not in args and 1 in args
    with pytest.raises(KeyError):
        args[3]
    args.add_block(np.array([1, 4]), ArgColumns(("grid", "note"), ([(9, 9, 9), (3, 3, 3)], np.array(["a", "b"]))))
    every = args.as_dicts()
    assert every == {row: args[row] for row in args} and every[1]["grid"] == (9, 9, 9), "all at once, as one by one"
    args = Args({0: {"error": "x"}, 2: {"stream": 99}})
    args.add_block(
        np.array([2, 1]), ArgColumns(("stream", "grid"), (np.array([7, 8]), [(1, 1, 1), (2, 1, 1)]))
    )
    taken = args.take(np.array([2, 3, 1]))
    assert taken[0] == {"stream": 99, "grid": (1, 1, 1)} and 1 not in taken and taken[2]["stream"] == 8
    t = ActivityTable.concat([(ActivityTable.empty(), np.zeros(0, np.int32), np.zeros(0, np.int32), 0)])
    assert not t.args
    with pytest.raises(ValueError, match="has 1 values for 2 rows"):
        Args().add_block(np.array([0, 1]), ArgColumns(("k",), (np.array([1]),)))


def test_sink_keeps_column_args_of_the_rows_it_keeps():
    from polyprof.model import ArgColumns
    from polyprof.plugin.sink import Sink

    sink = Sink("b")
    host, thread = sink.host_device(), sink.host_thread(1)
    kept = sink.activities(
        {
            "kind": np.zeros(3, dtype=np.int64),
            "name": ["a", "b", "c"],
            "device": np.full(3, host),
            "resource": np.full(3, thread),
            "start": np.array([1, 5, 3]),
            "end": np.array([2, 4, 4]),  # the second ends before it starts: rejected
        },
        {2: {"d": 1}},
        ArgColumns(("n",), (np.array([10, 20, 30]),)),
    )
    t = sink.builder.freeze()
    assert kept == 2 and [r.args for r in t] == [{"n": 10}, {"n": 30, "d": 1}]
    from polyprof.errors import BackendContractError

    with pytest.raises(BackendContractError, match="one value per row"):
        sink.activities(
            {"kind": [0], "name": ["a"], "device": [host], "resource": [thread], "start": [1], "end": [2]},
            arg_columns=ArgColumns(("n",), (np.array([1, 2]),)),
        )
