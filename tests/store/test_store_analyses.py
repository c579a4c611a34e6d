"""The store's device analyses (SQL over its tables) give the numbers the in-memory analyses give on the
same traces: kernel breakdown, temporal breakdown, idle time by cause and communication overlap."""

import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")

from polyprof.analysis import device  # noqa: E402
from polyprof.analysis.operators import operator_table  # noqa: E402
from polyprof.analysis.ranks import rank_view  # noqa: E402
from polyprof.analysis.steps import step_breakdown  # noqa: E402
from polyprof.model import ActivityBuilder, ActivityKind, Device, Resource, Trace  # noqa: E402
from polyprof.store.query import Store  # noqa: E402

K = ActivityKind
KERNELS = ["gemm_a", "gemm_b", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "elementwise", "cudaStreamSync_kernel"]


def random_trace(seed: int, rank: int, n: int = 600) -> Trace:
    """Two GPUs, two streams each, kernels (some NCCL), copies and fills overlapping at random, each
    launched by a runtime call on the host (some launched after the stream went idle); ten steps on
    the main thread with ops nested at random in them (some of the same name, one in another), and
    ops on a second thread."""
    rng = random.Random(seed)
    b = ActivityBuilder()
    op_ids = _steps_and_ops(b, rng)
    t = {(d, s): 1_000_000 for d in (1, 2) for s in (0, 1)}  # (host clocks are positive)
    for i in range(n):
        dev, stream = rng.choice([1, 2]), rng.choice([0, 1])
        gap = rng.choice([0, 5_000, 20_000, 80_000, 400_000])
        start = t[(dev, stream)] + gap
        dur = rng.randint(1_000, 300_000)
        kind = rng.choice([K.KERNEL] * 6 + [K.GPU_MEMCPY, K.GPU_MEMSET])
        name = {K.GPU_MEMCPY: "Memcpy HtoD (Pageable -> Device)", K.GPU_MEMSET: "Memset (Device)"}.get(kind, rng.choice(KERNELS))
        launched = start - rng.choice([2_000, 50_000, 200_000])
        b.append(K.RUNTIME, "cuda_runtime", "cudaLaunchKernel", 0, 0, launched, launched + 1_500, correlation=i + 1)
        resource = 1 + (dev - 1) * 2 + stream
        by = rng.choice(op_ids) if rng.random() < 0.6 else 0  # the op that launched it (External id)
        b.append(kind, kind.name.lower(), name, dev, resource, start, start + dur, correlation=i + 1, external_id=by)
        t[(dev, stream)] = start + dur
    devices = [Device("host", "cpu", 0, f"rank{rank} host"), Device("cuda:0", "gpu", 0, "GPU 0", label="GPU 0"),
               Device("cuda:1", "gpu", 1, "GPU 1", label="GPU 1")]
    resources = [Resource(0, 100 + rank, "main thread"), Resource(1, 7, "stream 7"), Resource(1, 8, "stream 8"),
                 Resource(2, 7, "stream 7"), Resource(2, 8, "stream 8"), Resource(0, 300, "loader")]
    return Trace(activities=b.freeze(), devices=devices, resources=resources, metadata={"distributedInfo": {"rank": rank}})


OPS = ["aten::linear", "aten::addmm", "aten::relu", "aten::sum", "forward"]


def _steps_and_ops(b: ActivityBuilder, rng: random.Random) -> list[int]:
    """Ten steps with ops in them; returns the ops' External ids."""
    at = 1_000_000
    ids = []
    for step in range(10):
        length = rng.randint(2_000_000, 6_000_000)
        b.append(K.USER_ANNOTATION, "user_annotation", f"ProfilerStep#{step}", 0, 0, at, at + length)
        t = at + rng.randint(0, 50_000)
        while t < at + length - 200_000:
            name = rng.choice(OPS)
            dur = rng.randint(20_000, 400_000)
            end = min(t + dur, at + length - 1)
            kind = K.USER_ANNOTATION if name == "forward" else K.CPU_OP
            ids.append(len(ids) + 1)
            b.append(kind, kind.name.lower(), name, 0, 0, t, end, external_id=ids[-1])
            inner = t + (end - t) // 4
            for _ in range(rng.randint(0, 2)):  # children, sometimes of the parent's own name
                child = name if rng.random() < 0.3 else rng.choice(OPS[:4])
                c_end = inner + (end - t) // 5
                ids.append(len(ids) + 1)
                b.append(K.CPU_OP, "cpu_op", child, 0, 0, inner, c_end, external_id=ids[-1])
                inner = c_end + 1_000
            if rng.random() < 0.2:
                b.append(K.CPU_OP, "cpu_op", rng.choice(OPS[:4]), 0, 5, t, t + dur // 2)  # the loader thread
            t = end + rng.choice([0, 10_000, 300_000])
        at += length + rng.choice([0, 100_000])
    return ids


@pytest.fixture(scope="module")
def job():
    traces = [random_trace(20261206 + r, r) for r in range(2)]
    return traces, Store.of_traces(traces, [0, 1])


def _by(rows, *key):
    assert rows, "the analysis has rows to compare"
    return {tuple(r[k] for k in key): r for r in rows}


def test_kernel_breakdown(job):
    traces, store = job
    got = _by(store.analysis("kernels").to_pylist(), "rank", "device_name", "kernel")
    for rank, trace in enumerate(traces):
        for row in device.kernel_breakdown(trace).dicts():
            mine = got.pop((rank, row["device"], row["kernel"]))
            assert (mine["kind"], mine["calls"], mine["total_ns"], mine["min_ns"], mine["max_ns"]) == (
                row["kind"], row["calls"], row["total_ns"], row["min_ns"], row["max_ns"])
            assert mine["mean_ns"] == pytest.approx(row["mean_ns"]) and mine["share"] == pytest.approx(row["share"])
    assert not got, "no row the in-memory analysis does not have"


def test_temporal_breakdown(job):
    traces, store = job
    got = _by(store.analysis("temporal").to_pylist(), "rank", "device_name")
    for rank, trace in enumerate(traces):
        for row in device.temporal_breakdown(trace).dicts():
            mine = got.pop((rank, row["device"]))
            for column in ("span_ns", "idle_ns", "compute_ns", "non_compute_ns"):
                assert mine[column] == row[column], (rank, row["device"], column)
            assert mine["idle_share"] == pytest.approx(row["idle_share"])
    assert not got


def test_idle_time_by_cause(job):
    traces, store = job
    got = _by(store.analysis("idle").to_pylist(), "rank", "device_name", "stream", "cause")
    for rank, trace in enumerate(traces):
        for row in device.idle_breakdown(trace).dicts():
            if not row["gaps"]:
                assert (rank, row["device"], row["stream"], row["cause"]) not in got
                continue
            mine = got.pop((rank, row["device"], row["stream"], row["cause"]))
            assert (mine["gaps"], mine["idle_ns"]) == (row["gaps"], row["idle_ns"])
            assert mine["share"] == pytest.approx(row["share"])
    assert not got


def test_communication_overlap(job):
    traces, store = job
    got = _by(store.analysis("overlap").to_pylist(), "rank", "device_name")
    for rank, trace in enumerate(traces):
        for row in device.overlap(trace).dicts():
            mine = got.pop((rank, row["device"]))
            assert (mine["communication_ns"], mine["overlapped_ns"]) == (row["communication_ns"], row["overlapped_ns"])
    assert not got


def test_launch_latency(job):
    traces, store = job
    got = _by(store.analysis("launch").to_pylist(), "rank", "device_name")
    for rank, trace in enumerate(traces):
        table, _ = device.launch_latency(trace)
        for row in table.dicts():
            mine = got.pop((rank, row["device"]))
            assert (mine["launches"], mine["max_ns"], mine["worst"]) == (row["launches"], row["max_ns"], row["worst"])
            for column in ("mean_ns", "p50_ns", "p90_ns", "p99_ns"):
                assert mine[column] == pytest.approx(row[column]), column
    assert not got


def test_step_breakdown(job):
    traces, store = job
    got = _by(store.analysis("steps").to_pylist(), "rank", "step", "device")
    assert len({key[1] for key in got}) == 10
    for row in step_breakdown(traces, [0, 1]).dicts():
        mine = got.pop((row["rank"], row["step"], row["device"]))
        assert mine == row, (row["rank"], row["step"], row["device"])
    assert not got


def test_step_breakdown_of_a_rank_without_device_work():
    b = ActivityBuilder()
    _steps_and_ops(b, random.Random(7))
    resources = [Resource(0, 1, "main thread")] + [Resource(0, 10 + i, f"t{i}") for i in range(5)]
    trace = Trace(activities=b.freeze(), devices=[Device("host", "cpu", 0, "the host")], resources=resources)
    got = Store.of_traces([trace], [0]).analysis("steps").to_pylist()
    expected = step_breakdown([trace], [0]).dicts()
    assert [r["device"] for r in got] == ["host"] * 10 and all(r["host_only_ns"] > 0 for r in got)
    assert got == expected


def test_operator_table(job):
    traces, store = job
    got = _by(store.analysis("operators").to_pylist(), "rank", "op")
    for rank, trace in enumerate(traces):
        for row in operator_table(trace).dicts():
            mine = got.pop((rank, row["op"]))
            for column in ("calls", "total_ns", "self_ns", "device_ns", "device_total_ns"):
                assert mine[column] == row[column], (rank, row["op"], column)
            assert mine["mean_ns"] == pytest.approx(row["mean_ns"])
    assert not got


def test_operator_table_folds_a_chain_of_only_children_of_one_name():
    """x > x > x (each the other's only child, as aten::linear's wrappers nest) is one call of x; two
    chains side by side and a chain under an op of another name fold each on its own."""
    b = ActivityBuilder()
    ms = 1_000_000
    for at in (0, 100 * ms):  # two chains, apart
        for depth in range(3):
            b.append(K.CPU_OP, "cpu_op", "x", 0, 0, at + depth * ms, at + (50 - depth) * ms)
        b.append(K.CPU_OP, "cpu_op", "y", 0, 0, at + 10 * ms, at + 20 * ms)  # the innermost x's child
    b.append(K.CPU_OP, "cpu_op", "z", 0, 0, 200 * ms, 260 * ms)
    b.append(K.CPU_OP, "cpu_op", "x", 0, 0, 201 * ms, 250 * ms)
    b.append(K.CPU_OP, "cpu_op", "x", 0, 0, 202 * ms, 240 * ms)
    trace = Trace(activities=b.freeze(), devices=[Device("host", "cpu", 0, "the host")],
                  resources=[Resource(0, 1, "main thread")])
    got = {r["op"]: r for r in Store.of_traces([trace], [0]).analysis("operators").to_pylist()}
    expected = {r["op"]: r for r in operator_table(trace).dicts()}
    assert got.keys() == expected.keys() == {"x", "y", "z"}
    assert got["x"]["calls"] == 3 and got["x"]["self_ns"] == 2 * (50 - 10) * ms + (49 - 0) * ms, got["x"]
    for op, row in expected.items():
        assert {c: got[op][c] for c in ("calls", "total_ns", "self_ns")} == {c: row[c] for c in ("calls", "total_ns", "self_ns")}


def test_rank_view(job):
    traces, store = job
    view = rank_view(traces)
    got = _by(store.analysis("rank_steps").to_pylist(), "step", "rank")
    for row in view.steps:
        for rank, step_ns in row.times_ns.items():
            mine = got.pop((row.step, rank))
            assert (mine["step_ns"], mine["busy_ns"], mine["slowest"]) == (step_ns, row.busy_ns[rank], rank == row.slowest)
            assert mine["behind_ns"] == (row.behind_ns if rank == row.slowest else None)
    assert not got
    totals = store.analysis("rank_totals").to_pylist()
    assert [(r["rank"], r["steps"], r["collective_ns"], r["waited_ns"]) for r in totals] == [
        (r.rank, r.steps, r.collective_ns, r.waited_ns) for r in view.ranks]
    assert [r["mean_step_ns"] for r in totals] == pytest.approx([r.mean_step_ns for r in view.ranks])
    assert any(r.waited_ns for r in view.ranks) and all(r.collective_ns for r in view.ranks)


def test_overview_gathers_the_other_analyses_per_rank(job):
    traces, store = job
    got = store.analysis("overview").to_pylist()
    assert [r["rank"] for r in got] == [0, 1]
    for rank, (trace, mine) in enumerate(zip(traces, got, strict=True)):
        steps = [r for r in step_breakdown([trace], [rank]).dicts()]
        span = sum(r["step_ns"] for r in steps)
        for part in ("compute", "communication", "memory", "other", "host_only", "idle"):
            assert mine[f"{part}_share"] == pytest.approx(sum(r[f"{part}_ns"] for r in steps) / span), part
        kernels: dict[str, int] = {}
        for r in device.kernel_breakdown(trace).dicts():
            kernels[r["kernel"]] = kernels.get(r["kernel"], 0) + r["total_ns"]
        assert (mine["top_kernel"], mine["top_kernel_ns"]) == max(kernels.items(), key=lambda kv: kv[1])
        top_op = max(operator_table(trace).dicts(), key=lambda r: r["self_ns"])
        assert (mine["top_op"], mine["top_op_self_ns"]) == (top_op["op"], top_op["self_ns"])
        assert mine["steps"] == 10 and mine["made_others_wait_ns"] == 0  # no collective args: no blame


def test_two_stores_diff_as_their_traces_do(tmp_path):
    from polyprof import store
    from polyprof.analysis.diff import diff

    before, after = random_trace(1, 0), random_trace(2, 0, n=500)
    expected = diff(before, after, top=100)
    got = store.diff(Store.of_traces([before], [0]), Store.of_traces([after], [0]), top=100)
    assert got.per_step and got.step_ns == pytest.approx(expected.step_ns)
    for mine, theirs in ((got.operators, expected.operators), (got.kernels, expected.kernels)):
        theirs_by_name = {r[0]: r for r in theirs.rows}
        assert mine.rows and len(mine.rows) == len(theirs.rows) and mine.title == theirs.title
        for name, *numbers, change in mine.rows:
            assert numbers == pytest.approx(list(theirs_by_name[name][1:4])) and change == theirs_by_name[name][4], name


def test_polyprof_diff_of_two_stores_prints_what_changed(tmp_path):
    from polyprof import store
    from polyprof.formats import write_trace

    for name, seed in (("before", 1), ("after", 2)):
        write_trace(random_trace(seed, 0), tmp_path / f"{name}.json")
        store.write_store([tmp_path / f"{name}.json"], tmp_path / f"{name}.polyprof")
    polyprof = [sys.executable, "-m", "polyprof", "diff", tmp_path / "before.polyprof"]
    run = subprocess.run([*polyprof, tmp_path / "after.polyprof"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mean step:" in run.stdout and "aten::relu" in run.stdout and "gemm_a" in run.stdout
    mixed = subprocess.run([*polyprof, tmp_path / "after.json"], capture_output=True, text=True, timeout=120)
    assert mixed.returncode != 0 and "is a store and the other not" in mixed.stderr
