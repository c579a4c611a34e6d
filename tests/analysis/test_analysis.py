"""The analyses on traces whose answers are known: built row by row, every number worked out by hand."""

import random

import numpy as np
import pytest

from polyprof.analysis import device
from polyprof.analysis.diff import diff
from polyprof.analysis.intervals import merge, overlap_ns, union_ns
from polyprof.analysis.operators import operator_table
from polyprof.analysis.overview import overview
from polyprof.analysis.steps import select_steps, step_breakdown
from polyprof.model import ActivityBuilder, ActivityKind, Device, Resource, Trace
from polyprof.model.steps import steps_of

K = ActivityKind
US = 1000


def make_trace(rows, devices=("host", "gpu")):
    """rows: (kind, name, device, resource, start_us, end_us, correlation, external_id, args)."""
    b = ActivityBuilder()
    for kind, name, dev, res, s, e, *rest in rows:
        corr, ext, args = (list(rest) + [0, 0, None])[:3]
        b.append(kind, kind.name.lower(), name, dev, res, int(s * US), int(e * US), correlation=corr, external_id=ext, args=args)
    devs = [Device(key, "cpu" if key == "host" else "gpu", i, key, label="CPU" if key == "host" else "GPU 0") for i, key in enumerate(devices)]
    resources = [Resource(0, 1, "main thread"), Resource(1, 7, "stream 7"), Resource(1, 8, "stream 8")]
    return Trace(activities=b.freeze(), devices=devs, resources=resources)


def one_step():
    """A 100 us step on the host thread: an op (0-60) that launches two kernels, a copy and an NCCL kernel."""
    return make_trace([
        (K.USER_ANNOTATION, "ProfilerStep#3", 0, 0, 0, 100),
        (K.CPU_OP, "aten::mm", 0, 0, 0, 60, 0, 11, {"Input Dims": [[2, 2]]}),
        (K.CPU_OP, "aten::addmm", 0, 0, 5, 25, 0, 12),
        (K.RUNTIME, "cudaLaunchKernel", 0, 0, 10, 12, 101, 12),
        (K.RUNTIME, "cudaLaunchKernel", 0, 0, 30, 32, 102, 11),
        (K.RUNTIME, "cudaMemcpyAsync", 0, 0, 40, 41, 103, 11),
        (K.RUNTIME, "ncclLaunch", 0, 0, 45, 46, 104, 11),
        (K.KERNEL, "gemm", 1, 1, 20, 40, 101, 12),                  # launched at 10, waits 10 us
        (K.KERNEL, "gemm", 1, 1, 50, 70, 102, 11),                  # 10 us gap, launched (30) before it: kernel wait
        (K.GPU_MEMCPY, "Memcpy HtoD (Pageable -> Device)", 1, 1, 75, 80, 103, 11),  # gap 5 (< 30 us): kernel wait
        (K.KERNEL, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1, 2, 60, 90, 104, 11),  # overlaps gemm 60-70
    ])


def test_kernel_types_and_breakdown():
    t = one_step()
    types = {r["kind"]: r["total_ns"] for r in device.kernel_types(t).dicts()}
    # computation alone 20-40, 50-60; with communication 60-70; communication alone 70-75, 80-90; with memory 75-80
    assert types == {"COMPUTATION": 30 * US, "COMPUTATION overlapping COMMUNICATION": 10 * US,
                     "COMMUNICATION": 15 * US, "COMMUNICATION overlapping MEMORY": 5 * US}
    kernels = {r["kernel"]: r for r in device.kernel_breakdown(t).dicts()}
    assert kernels["gemm"]["calls"] == 2 and kernels["gemm"]["total_ns"] == 40 * US and kernels["gemm"]["kind"] == "COMPUTATION"
    assert kernels["gemm"]["share"] == pytest.approx(40 / 75)
    assert kernels["Memcpy HtoD (Pageable -> Device)"]["kind"] == "MEMORY"


def test_temporal_idle_launch_and_overlap():
    t = one_step()
    (temporal,) = device.temporal_breakdown(t).dicts()
    assert temporal["span_ns"] == 70 * US and temporal["idle_ns"] == 10 * US  # 20-90, nothing runs 40-50
    assert temporal["compute_ns"] == 40 * US and temporal["non_compute_ns"] == 20 * US
    idle = {(r["stream"], r["cause"]): r["idle_ns"] for r in device.idle_breakdown(t).dicts()}
    assert idle[("stream 7", "kernel wait")] == 15 * US, "launched before the previous row ended, gaps under 30 us"
    assert idle[("stream 7", "host wait")] == 0 and idle[("stream 7", "other")] == 0
    host_late = one_step()
    host_late.activities.columns["start"][4] = 45 * US  # the second gemm's launch now after the first ended
    assert {r["cause"]: r["idle_ns"] for r in device.idle_breakdown(host_late).dicts() if r["stream"] == "stream 7"}["host wait"] == 10 * US
    table, samples = device.launch_latency(t)
    (lat,) = table.dicts()
    assert lat["launches"] == 4 and lat["max_ns"] == 35 * US and lat["worst"] == "Memcpy HtoD (Pageable -> Device)"
    assert sorted(samples["GPU 0 (gpu)"].tolist()) == [10 * US, 15 * US, 20 * US, 35 * US]
    (ov,) = device.overlap(t).dicts()
    assert ov["communication_ns"] == 30 * US and ov["overlapped_ns"] == 10 * US


def test_step_breakdown_adds_up_to_the_step():
    (row,) = step_breakdown(one_step()).dicts()
    assert row["step"] == 3 and row["step_ns"] == 100 * US
    # computation 20-40, 50-70 (40); communication not under it 70-90 (20); the copy is under it (0);
    # host code on the step's thread while the device has nothing: 0-20, 40-50 (30); idle 90-100 (10)
    assert (row["compute_ns"], row["communication_ns"], row["memory_ns"], row["host_only_ns"], row["idle_ns"]) == (
        40 * US, 20 * US, 0, 30 * US, 10 * US)
    assert sum(row[k] for k in ("compute_ns", "communication_ns", "memory_ns", "other_ns", "host_only_ns", "idle_ns")) == row["step_ns"]
    host_only = make_trace([(K.USER_ANNOTATION, "ProfilerStep#0", 0, 0, 0, 10), (K.CPU_OP, "op", 0, 0, 2, 6)], devices=("host",))
    (h,) = step_breakdown(host_only).dicts()
    assert (h["device"], h["host_only_ns"], h["idle_ns"]) == ("host", 4 * US, 6 * US)


def test_operator_table_self_and_device_time():
    ops = {r["op"]: r for r in operator_table(one_step()).dicts()}
    mm, addmm = ops["aten::mm"], ops["aten::addmm"]
    assert mm["total_ns"] == 60 * US and mm["self_ns"] == (60 - 20 - 2 - 1 - 1) * US  # addmm and three runtime calls
    assert addmm["self_ns"] == 18 * US and addmm["device_ns"] == 20 * US  # its own gemm
    assert mm["device_ns"] == 20 * US + 5 * US + 30 * US and mm["device_total_ns"] == mm["device_ns"] + 20 * US
    assert "ProfilerStep#3" not in ops and "cudaLaunchKernel" not in ops
    by_shape = operator_table(one_step(), by_shape=True).dicts()
    assert {(r["op"], r["input_dims"]) for r in by_shape} >= {("aten::mm", "[[2, 2]]"), ("aten::addmm", "")}


def test_select_steps_keeps_the_work_a_step_launched():
    two = make_trace([
        (K.USER_ANNOTATION, "ProfilerStep#0", 0, 0, 0, 10), (K.USER_ANNOTATION, "ProfilerStep#1", 0, 0, 10, 20),
        (K.RUNTIME, "launch", 0, 0, 8, 9, 1), (K.KERNEL, "k0", 1, 1, 12, 14, 1),   # launched in step 0, runs in step 1
        (K.RUNTIME, "launch", 0, 0, 15, 16, 2), (K.KERNEL, "k1", 1, 1, 17, 19, 2),
    ])
    first = select_steps(two, [0])
    assert sorted(first.activities.names().tolist()) == ["ProfilerStep#0", "k0", "launch"]
    assert list(steps_of(select_steps(two, list(steps_of(two))[:-1]))) == [0]


def test_interval_helpers_against_brute_force():
    rnd = random.Random(1818)
    for _ in range(300):
        def intervals(n):
            s = np.array([rnd.randrange(0, 100) for _ in range(n)], np.int64)
            return s, s + np.array([rnd.randrange(0, 20) for _ in range(n)], np.int64)

        a, b = intervals(rnd.randrange(0, 8)), intervals(rnd.randrange(0, 8))
        cover = lambda iv: {t for s, e in zip(*iv, strict=True) for t in range(s, e)}  # noqa: E731
        assert union_ns(*a) == len(cover(a))
        assert overlap_ns(a, b) == len(cover(a) & cover(b))
        ms, me = merge(*a)
        assert all(me[i] < ms[i + 1] for i in range(len(ms) - 1)) and len(cover((ms, me))) == len(cover(a))


def test_diff_names_what_changed():
    before = one_step()
    after = make_trace([
        (K.USER_ANNOTATION, "ProfilerStep#3", 0, 0, 0, 50), (K.CPU_OP, "aten::mm", 0, 0, 0, 30, 0, 11),
        (K.CPU_OP, "aten::new_op", 0, 0, 31, 40), (K.KERNEL, "gemm", 1, 1, 20, 30, 0, 11),
    ])
    d = diff(before, after)
    assert d.step_ns == (100 * US, 50 * US)
    ops = {r["name"]: r for r in d.operators.dicts()}
    assert ops["aten::mm"]["delta_ns"] == -30 * US and ops["aten::mm"]["change"] == "0.50x"
    assert ops["aten::new_op"]["change"] == "new" and ops["aten::addmm"]["change"] == "vanished"
    kernels = {r["name"]: r for r in d.kernels.dicts()}
    assert kernels["gemm"]["after_ns"] == 10 * US and kernels["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["change"] == "vanished"


def test_overview_findings_say_the_largest_facts_in_words():
    ov = overview(one_step())
    text = " | ".join(ov.findings)
    assert "GPU 0 (gpu) has nothing to do 40% of step time" in text
    assert "The largest host op by self time is aten::mm" in text


def test_tables_become_dataframes_where_pandas_is_installed():
    ov = overview(one_step())
    pandas = pytest.importorskip("pandas", reason="needs pandas for Table.to_pandas")
    frame = ov.kernels.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and list(frame.columns) == list(ov.kernels.columns)


def test_the_terminal_views_and_diff_show_the_same_numbers(tmp_path):
    import subprocess
    import sys

    from polyprof.formats import write_trace

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    write_trace(one_step(), str(before))
    slower = one_step()
    slower.activities.columns["end"][0] = 150 * US  # the step takes 150 us
    write_trace(slower, str(after))
    run = lambda *a: subprocess.run([sys.executable, "-m", "polyprof", *a], capture_output=True, text=True, timeout=120)  # noqa: E731
    for view, says in (("steps", "40.000 us"), ("kernels", "gemm"), ("ops", "aten::addmm"),
                       ("idle", "kernel wait"), ("launch", "launches"), ("devices", "non compute"),
                       ("backends", "Backends")):
        r = run("summary", "--view", view, str(before))
        assert r.returncode == 0 and says in r.stdout, (view, r.stdout, r.stderr)
    r = run("diff", str(before), str(after), "-o", str(tmp_path / "diff.html"))
    assert r.returncode == 0 and "mean step: 100.000 us before, 150.000 us after (+50.0%)" in r.stdout, r.stdout + r.stderr
    assert "Diff against the baseline" in (tmp_path / "diff.html").read_text()
