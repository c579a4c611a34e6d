"""The vectorised merge: identical to the per-row merge it replaced (tests/merge_oracle.py) on the same
parts, and the backend's External id stands where the old merge overwrote it."""

from __future__ import annotations

import merge_oracle
import numpy as np
import pytest
from native_sides import use_python_side

import polyprof._native
from polyprof.merge import merge
from polyprof.merge.containment import innermost_open_span, thread_codes
from polyprof.merge.order import start_order
from polyprof.model import FLOW_AC2G, ActivityKind, ArgColumns, BackendStatus
from polyprof.plugin.sink import Sink

W0, W1 = 1_000_000, 9_000_000


def _host_part(rng: np.random.Generator, threads: int, spans_per_thread: int) -> Sink:
    """Nested ops and annotations per thread (and a few that overlap without nesting), some outside
    the window, some with args."""
    sink = Sink("hostish")
    host = sink.host_device()
    rows = {k: [] for k in ("kind", "name", "device", "resource", "start", "end", "correlation", "external_id")}
    args = {}
    for t in range(threads):
        res = sink.host_thread(100 + t)
        stack_end = []
        time = W0 - 50_000
        for _ in range(spans_per_thread):
            time += int(rng.integers(0, 30_000))
            while stack_end and stack_end[-1] < time:
                stack_end.pop()
            limit = stack_end[-1] if stack_end and rng.random() < 0.9 else time + 200_000
            end = min(limit, time + int(rng.integers(0, 400_000)))
            kind = ActivityKind.CPU_OP if rng.random() < 0.6 else ActivityKind.USER_ANNOTATION
            ident = int(rng.integers(1, 1 << 40))
            if rng.random() < 0.1:
                args[len(rows["start"])] = {"i": len(rows["start"])}
            for k, v in (("kind", int(kind)), ("name", f"op{int(rng.integers(0, 20))}"), ("device", host),
                         ("resource", res), ("start", time), ("end", end), ("correlation", ident),
                         ("external_id", ident)):
                rows[k].append(v)
            stack_end.append(end)
    sink.activities({k: np.array(v) if k != "name" else v for k, v in rows.items()}, args)
    sink.counter("depth", 3.0, ts=W0 + 5)
    sink.counter("depth", 4.0, ts=W1 + 5)  # outside: dropped
    return sink


def _device_part(rng: np.random.Generator, name: str, threads: int, launches: int, first_id: int) -> Sink:
    """Launches (no External id: containment fills it) on the host threads, each with an ac2g flow to
    device work on one of three devices; a few lone flow ends and rows outside the window."""
    sink = Sink(name)
    host = sink.host_device()
    host_rows = [sink.host_thread(100 + t) for t in range(threads)]
    queues = []
    for d in range(3):
        dev = sink.device(f"{name}:{d}", type="gpu", index=d, name=f"{name} {d}", properties={"d": d})
        queues += [(dev, sink.resource(dev, 1 + q, f"queue {1 + q}")) for q in range(2)]
    start = np.sort(rng.integers(W0 - 20_000, W1 + 20_000, launches))
    ids = first_id + np.arange(launches)
    q = rng.integers(0, len(queues), launches)
    kinds = rng.choice([int(ActivityKind.KERNEL), int(ActivityKind.GPU_MEMCPY), int(ActivityKind.GPU_MEMSET)], launches)
    lone = rng.random(launches) < 0.03
    n = launches
    sink.activities(
        {
            "kind": np.concatenate([np.full(n, int(ActivityKind.RUNTIME)), kinds]),
            "name": ["launch"] * n + [f"k{int(i) % 7}" for i in range(n)],
            "device": np.concatenate([np.full(n, host), np.array([queues[i][0] for i in q])]),
            "resource": np.concatenate([np.array(host_rows)[rng.integers(0, threads, n)], np.array([queues[i][1] for i in q])]),
            "start": np.concatenate([start, start + 3_000]),
            "end": np.concatenate([start + 1_000, start + 3_000 + rng.integers(0, 9_000, n)]),
            "correlation": np.concatenate([ids, ids]),
            "flow_id": np.concatenate([np.where(lone, 0, ids), ids]),
            "flow_type": np.full(2 * n, FLOW_AC2G),
            "flow_start": np.concatenate([np.ones(n, bool), np.zeros(n, bool)]),
        },
        arg_columns=ArgColumns(("bytes",), (np.arange(2 * n, dtype=np.int64),)),
    )
    return sink


def _parts(seed: int, threads: int = 3, spans: int = 400, launches: int = 500):
    rng = np.random.default_rng(seed)
    sinks = [_host_part(rng, threads, spans), _device_part(rng, "gpu", threads, launches, 1),
             _device_part(rng, "npu", threads, launches // 2, 1)]  # colliding flow ids
    return [s.seal(BackendStatus(s.backend_name)) for s in sinks]


def _merged(fn, parts):
    return fn(parts, window=(W0, W1), epoch_offset_ns=0, base_time_ns=0, metadata={},
              kind_filters={"npu": {int(ActivityKind.RUNTIME), int(ActivityKind.KERNEL)}})


@pytest.fixture(params=["C", "numpy"])
def passes(request, monkeypatch):
    """Each merge pass both ways: with the C walks of csrc/merge_passes.c and with their numpy twins."""
    if request.param == "C" and polyprof._native.extension is None:
        pytest.skip("needs polyprof's C extension (built by setup.sh)")
    if request.param == "numpy":
        use_python_side(monkeypatch)
    return request.param


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_vectorised_merge_gives_exactly_what_the_per_row_merge_gave(seed, passes):
    new = _merged(merge, _parts(seed))
    old = _merged(merge_oracle.merge, _parts(seed))
    assert len(new.activities) == len(old.activities) > 1000
    for column in ("kind", "device", "resource", "start", "end", "correlation", "external_id", "flow_id",
                   "flow_type", "flow_start"):
        assert np.array_equal(new.activities[column], old.activities[column]), column
    assert new.activities.names().tolist() == old.activities.names().tolist()
    cats = [new.activities.strings[int(c)] for c in new.activities["cat"]]
    assert cats == [old.activities.strings[int(c)] for c in old.activities["cat"]]
    assert new.activities.args.rows().tolist() == old.activities.args.rows().tolist()
    assert all(new.activities.args[r] == old.activities.args[r] for r in new.activities.args.rows().tolist())
    assert [(d.key, d.pid) for d in new.devices] == [(d.key, d.pid) for d in old.devices]
    assert [(r.device, r.id, r.name) for r in new.resources] == [(r.device, r.id, r.name) for r in old.resources]
    assert [(s.name, s.ts, s.value) for s in new.counters.samples] == [(s.name, s.ts, s.value) for s in old.counters.samples]
    assert {n: (s.activities, s.dropped) for n, s in new.backends.items()} == {
        n: (s.activities, s.dropped) for n, s in old.backends.items()
    }
    kinds = new.activities["kind"]
    assert (kinds == int(ActivityKind.GPU_USER_ANNOTATION)).sum() > 10, "the fixture exercises every pass"
    launches = kinds == int(ActivityKind.RUNTIME)
    assert (new.activities["external_id"][launches] != 0).mean() > 0.3, "containment filled launches"


def test_containment_matches_a_stack_walk_on_overlapping_and_tied_spans(passes):
    """The exact semantics of the per-row stack walk, on random spans that nest, overlap without
    nesting (asyncio tasks on one thread) and tie."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        start = rng.integers(0, int(rng.integers(5, 300)), n)
        end = start + rng.integers(0, int(rng.integers(1, 100)), n)
        device, resource = rng.integers(0, 2, n), rng.integers(0, 3, n)
        is_span = rng.random(n) < 0.5
        order = start_order(start, end)
        order = np.arange(n) if order is None else order
        spans, calls = order[is_span[order]], order[~is_span[order]]
        got = innermost_open_span(start, end, thread_codes(device, resource), spans, calls)
        expected = _stack_walk(start, end, device, resource, is_span)
        assert {int(c): int(s) for c, s in zip(calls, got, strict=True) if s >= 0} == expected


def _stack_walk(start, end, device, resource, is_span):
    """The per-row stack walk of the old merge (the oracle's), on plain columns."""
    from polyprof.model import ActivityTable

    columns = {"start": start, "end": end, "device": device, "resource": resource}
    table = ActivityTable(None, columns, None)
    return merge_oracle.innermost_open_span(table, np.flatnonzero(is_span), np.flatnonzero(~is_span))


def test_a_backends_external_id_stands_and_an_op_open_at_the_launch_refines_it():
    sink = Sink("dev")
    host = sink.host_device()
    t = sink.host_thread(1)
    gpu = sink.device("d:0", type="gpu", index=0)
    q = sink.resource(gpu, 1)
    # annotations a [0, 100] and b [10, 90] interleave (asyncio); an aten op [60, 70] inside both
    sink.activities({"kind": np.array([1, 1, 0]), "name": ["a", "b", "aten::mm"], "device": np.full(3, host),
                     "resource": np.full(3, t), "start": np.array([0, 10, 60]) + W0,
                     "end": np.array([100, 90, 70]) + W0, "correlation": np.array([11, 12, 13])})
    # launch 1 by task a at 20 (ext 11, inside b too), launch 2 by task a at 65 (inside the op)
    for i, (at, ext) in enumerate(((20, 11), (65, 11)), start=1):
        sink.activity(ActivityKind.RUNTIME, "launch", device=host, resource=t, start=W0 + at, end=W0 + at + 2,
                      correlation=i, external_id=ext, flow_id=i, flow_start=True)
        sink.activity(ActivityKind.KERNEL, f"k{i}", device=gpu, resource=q, start=W0 + 200 + i, end=W0 + 210 + i,
                      correlation=i, external_id=ext, flow_id=i)
    part = sink.seal(BackendStatus("dev"), context_scoped=True)
    trace = merge([part], window=(W0, W1), epoch_offset_ns=0, base_time_ns=0, metadata={})
    ext = {r.name: r.external_id for r in trace.activities if r.name.startswith("k")}
    assert ext == {"k1": 11, "k2": 13}, "a's kernel stays a's although b was open; the op refines"
    gpu_spans = {r.name for r in trace.activities_of(ActivityKind.GPU_USER_ANNOTATION)}
    assert gpu_spans == {"a"}, "device-side spans follow the backend's id, not the later annotation"


def test_an_id_given_on_the_device_row_only_stands_and_names_the_launch():
    """The id a backend hands over is authoritative wherever it puts it: tasks a and b interleave on one
    thread (b opens inside a), each launches one kernel, and the backend names each kernel's task on the
    device row only. Before, the launches were filled by containment (b's, the innermost) and the
    kernels then took their launch's id: both b's."""
    sink = Sink("dev")
    host = sink.host_device()
    t = sink.host_thread(1)
    gpu = sink.device("d:0", type="gpu", index=0)
    q = sink.resource(gpu, 1)
    sink.activities({"kind": np.array([1, 1]), "name": ["a", "b"], "device": np.full(2, host),
                     "resource": np.full(2, t), "start": np.array([0, 10]) + W0, "end": np.array([100, 90]) + W0,
                     "correlation": np.array([11, 12])})
    for i, (at, task) in enumerate(((20, 11), (30, 12)), start=1):
        sink.activity(ActivityKind.RUNTIME, "launch", device=host, resource=t, start=W0 + at, end=W0 + at + 2,
                      correlation=i, flow_id=i, flow_start=True)
        sink.activity(ActivityKind.KERNEL, f"k{i}", device=gpu, resource=q, start=W0 + 200 + i, end=W0 + 210 + i,
                      correlation=i, external_id=task, flow_id=i)
    part = sink.seal(BackendStatus("dev"), context_scoped=True)
    trace = merge([part], window=(W0, W1), epoch_offset_ns=0, base_time_ns=0, metadata={})
    kernels = {r.name: r.external_id for r in trace.activities_of(ActivityKind.KERNEL)}
    launches = sorted(r.external_id for r in trace.activities_of(ActivityKind.RUNTIME))
    assert kernels == {"k1": 11, "k2": 12} and launches == [11, 12]


def test_the_merge_leaves_its_parts_statuses_alone_and_merging_again_counts_the_same():
    """The merge is a function of sealed parts: what it drops and keeps is its report, folded into the
    trace's snapshot of each status, never written into the parts (a dump merges the same parts as the
    window's end will)."""
    parts = _parts(0)
    before = {p.backend: (p.status.activities, dict(p.status.dropped)) for p in parts}
    first, second = _merged(merge, parts), _merged(merge, parts)
    assert {p.backend: (p.status.activities, dict(p.status.dropped)) for p in parts} == before
    counts = {n: (s.activities, s.dropped) for n, s in first.backends.items()}
    assert counts == {n: (s.activities, s.dropped) for n, s in second.backends.items()}
    assert counts["npu"][1]["activity filter"] > 0 and sum(a for a, _ in counts.values()) == len(first.activities) - (
        first.activities["kind"] == int(ActivityKind.GPU_USER_ANNOTATION)).sum()
