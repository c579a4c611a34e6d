import asyncio
import json
import threading

import fake_backends
import numpy as np
import pytest
from fake_backends import SimDeviceBackend

import polyprof
import polyprof.plugin
from polyprof import annotations
from polyprof.engine.registry import Registry
from polyprof.errors import BackendUnavailableError, ConfigError, PolyprofError
from polyprof.formats import dumps_chrome_trace
from polyprof.model import ActivityKind
from polyprof.plugin import SessionBase


@pytest.fixture
def sim(registry):
    backend = SimDeviceBackend()
    registry.register(backend)
    return backend


def test_device_work_gets_the_enclosing_annotation_as_external_id_and_a_flow(registry, sim):
    with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
        with polyprof.record_function("outer"):
            sim.launch("k_outer")
            with polyprof.record_function("inner"):
                sim.launch("k_inner")
        sim.launch("k_none")
    trace = prof.trace
    ann = {a.name: a for a in trace.activities_of(ActivityKind.USER_ANNOTATION)}
    kernels = {k.name: k for k in trace.activities_of(ActivityKind.KERNEL)}
    runtime = trace.activities_of(ActivityKind.RUNTIME)
    assert kernels["k_outer"].external_id == ann["outer"].correlation
    assert kernels["k_inner"].external_id == ann["inner"].correlation
    assert kernels["k_none"].external_id == 0
    assert len(runtime) == 3 and all(r.cat == "sim_runtime" for r in runtime)
    starts = {r.flow_id for r in runtime if r.flow_start}
    ends = {k.flow_id for k in kernels.values() if not k.flow_start}
    assert starts == ends and len(starts) == 3
    session = sim.sessions[0]
    assert [k for _, k in session.pushed] == ["annotation", "annotation"], "push fanned out per annotation"
    assert session.stack == [], "pushes and pops balanced"


def test_default_activities_are_everything_available(registry, sim):
    """...but a backend whose traits say on_by_default=False (the python tracer), which only runs when asked."""
    from polyprof.plugin.traits import backend_traits

    prof = polyprof.profile(registry=registry)
    available = {e.name for e in registry.entries() if not e.broken and registry.probe(e).available}
    opt_in = {e.name for e in registry.entries() if not backend_traits(e.backend).on_by_default}
    assert set(prof.backends) == available - opt_in and {"host", "simdev"} <= available and "python" in opt_in


def test_devices_resources_and_metadata_in_trace(registry, sim):
    with polyprof.profile(["cpu", "simdev"], registry=registry, metadata={"run": "A"}) as prof:
        sim.launch("k")
    trace = prof.trace
    dev = trace.device_by_key("sim:0")
    assert dev.name == "Sim GPU" and dev.properties == {"memory": 1 << 30} and dev.pid == 0
    assert trace.metadata["run"] == "A"
    status = trace.backends
    assert status["simdev"].to_json() == {"state": "ran", "activities": 2}
    assert status["host"].state == "ran"
    written = json.loads(dumps_chrome_trace(trace))["polyprof"]["backends"]
    assert written["simdev"] == {"state": "ran", "activities": 2}, "the writer serialises the statuses"
    assert "backends" not in trace.metadata["polyprof"], "one owner: the status objects"


def test_activities_outside_the_window_are_dropped_and_counted(registry):
    from fake_backends import FaultyBackend

    class EarlySession:
        def __init__(self, ctx):
            self.ctx = ctx

        def prepare(self): ...
        def start(self): ...
        def stop(self): ...
        def close(self): ...

        def collect(self, sink):
            d = sink.device("e:0", type="sim")
            r = sink.resource(d, 0)
            ws = self.ctx.window_start
            sink.activity(
                ActivityKind.KERNEL, "before", device=d, resource=r, start=ws - 10_000, end=ws - 5_000
            )
            sink.activity(ActivityKind.KERNEL, "inside", device=d, resource=r, start=ws + 1, end=ws + 5)

    backend = FaultyBackend("early")
    backend.create_session = lambda config, ctx: EarlySession(ctx)
    registry.register(backend)
    with polyprof.profile(["early"], registry=registry) as prof:
        pass
    assert [a.name for a in prof.trace.activities] == ["inside"]
    assert prof.trace.backends["early"].dropped == {"outside capture window": 1}


def test_requested_but_unavailable_activity_fails_with_the_reason_before_starting(registry):
    class Absent(SimDeviceBackend):
        name = "absent"
        activities = frozenset({"ABSENT"})

        def probe(self):
            return polyprof.Availability.no("no Absent driver: install absent-driver >= 2")

    registry.register(Absent())
    with pytest.raises(BackendUnavailableError, match="no Absent driver: install absent-driver >= 2"):
        polyprof.profile(["cpu", "absent"], registry=registry)
    with polyprof.profile(registry=registry) as prof:  # by default it is just left out, and said so
        pass
    assert prof.trace.backends["absent"].state == "unavailable"
    assert "no Absent driver" in prof.trace.backends["absent"].reason


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(schedule=5), "schedule must be a callable"),
        (dict(on_trace_ready="x"), "on_trace_ready must be callable"),
        (dict(call_timeout_s=0), "call_timeout_s must be a positive"),
        (dict(call_timeout_s=float("nan")), "call_timeout_s must be a positive"),
        (dict(backend_options={"nope": {}}), "backend_options names a backend"),
    ],
)
def test_invalid_config_is_rejected_before_anything_starts(registry, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        polyprof.profile(["cpu"], registry=registry, **kwargs)


def test_activity_listed_twice_and_bad_types(registry):
    with pytest.raises(ConfigError, match="listed twice"):
        polyprof.profile(["cpu", "CPU"], registry=registry)
    with pytest.raises(ConfigError, match="activities must be names"):
        polyprof.profile([42], registry=registry)


def test_backend_options_are_checked_by_the_backend_before_start(registry):
    class Picky(SimDeviceBackend):
        name = "picky"
        activities = frozenset({"PICKY"})

        def check_options(self, options):
            if options.get("device", 0) > 1:
                raise ConfigError(
                    f"device {options['device']} does not exist; devices: 0 (Sim GPU), 1 (Sim GPU)"
                )

    registry.register(Picky())
    with pytest.raises(ConfigError, match="device 5 does not exist; devices: 0"):
        polyprof.profile(["picky"], registry=registry, backend_options={"picky": {"device": 5}})


def test_only_one_profile_records_at_a_time(registry, sim):
    with polyprof.profile(["cpu"], registry=registry):
        other = polyprof.profile(["cpu", "simdev"], registry=registry)
        with pytest.raises(PolyprofError, match="already recording"):
            other.start()
        assert sim.sessions and sim.sessions[-1].closed, "the refused profile closed the sessions it prepared"
        assert other._window is None
    with polyprof.profile(["cpu"], registry=registry):
        pass  # free again


def test_profile_cannot_be_started_twice_and_trace_needs_a_run(registry):
    prof = polyprof.profile(["cpu"], registry=registry)
    with pytest.raises(PolyprofError, match="no trace has been recorded yet"):
        _ = prof.trace
    prof.start()
    with pytest.raises(PolyprofError, match="already started"):
        prof.start()
    prof.stop()
    prof.stop()  # idempotent
    prof.start()  # a stopped profile can record again, like torch.profiler's
    with polyprof.record_function("second run"):
        pass
    prof.stop()
    assert [a.name for a in prof.trace.activities] == ["second run"]


def test_add_metadata_and_json(registry):
    with polyprof.profile(["cpu"], registry=registry) as prof:
        pass
    prof.add_metadata("model", "mlp")
    prof.add_metadata_json("cfg", '{"lr": 0.1}')
    assert prof.trace.metadata["model"] == "mlp" and prof.trace.metadata["cfg"] == {"lr": 0.1}
    with pytest.raises(ConfigError, match="not valid JSON"):
        prof.add_metadata_json("bad", "{nope")


def test_annotations_from_threads_and_asyncio_tasks(registry):
    async def task(name, delay):
        with polyprof.record_function(name):
            await asyncio.sleep(delay)
            with polyprof.record_function(name + ".child"):
                await asyncio.sleep(0)

    def thread_work(i):
        with polyprof.record_function(f"thread{i}"):
            pass

    async def main():
        await asyncio.gather(task("a", 0.01), task("b", 0.0))

    with polyprof.profile(["cpu"], registry=registry) as prof:
        threads = [threading.Thread(target=thread_work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        asyncio.run(main())
    acts = {a.name: a for a in prof.trace.activities}
    assert {f"thread{i}" for i in range(4)} <= set(acts)
    tids = {prof.trace.resources[acts[f"thread{i}"].resource].id for i in range(4)}
    assert len(tids) == 4, "each thread gets its own row"
    # the child of each task is attributed to its own task's span, though the tasks interleave
    child_parent = {}
    for buf_events in [acts["a.child"], acts["b.child"]]:
        child_parent[buf_events.name] = buf_events
    assert acts["a"].start <= acts["a.child"].start and acts["a.child"].end <= acts["a"].end
    assert acts["b"].start <= acts["b.child"].start and acts["b.child"].end <= acts["b"].end


def test_async_decorator_covers_the_awaited_call(registry):
    @polyprof.record_function("fetch")
    async def fetch():
        await asyncio.sleep(0.01)
        return 7

    with polyprof.profile(["cpu"], registry=registry) as prof:
        assert asyncio.run(fetch()) == 7
    (span,) = prof.trace.activities
    assert span.name == "fetch" and span.duration >= 9_000_000


def test_decorator_is_safe_for_recursion(registry):
    @polyprof.record_function("fib")
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    with polyprof.profile(["cpu"], registry=registry) as prof:
        assert fib(6) == 8
    acts = list(prof.trace.activities)
    assert len(acts) == 25 and all(a.end >= a.start for a in acts)
    # properly nested: sorted by start, each span's end is within its parent's
    starts = np.array([a.start for a in acts])
    assert np.all(np.diff(starts) >= 0)


def _with_block(name, args=None):
    """What ``@record_function(name, args)`` is meant to be: each call inside a ``with`` block."""

    def wrap(fn):
        def call(*a, **kw):
            with polyprof.record_function(name, args):
                return fn(*a, **kw)

        return call

    return wrap


@pytest.mark.parametrize("device", [True, False], ids=["pushes", "no-pushes"])
@pytest.mark.parametrize("span", [polyprof.record_function, _with_block], ids=["decorator", "with"])
def test_a_decorated_call_records_the_span_a_with_block_records(registry, span, device):
    """Names, args, nesting, recursion, an exception and the External ids of instants are the same
    whichever way the span is opened (the decorator has a way of its own on both paths: SpanCall in
    C, an inlined wrapper in Python), with a device backend taking pushes (its launches get the
    span's id both ways) or none; outside a profile the function is just called."""
    sim = SimDeviceBackend()
    registry.register(sim)

    @span("leaf", {"k": 1})
    def leaf(x):
        sim.launch(f"k{x}")
        polyprof.instant(f"in leaf {x}")
        return x + 1

    @span("fib")
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    @span("fails", "s")
    def fails():
        leaf(0)
        raise KeyError("boom")

    @span("outer")
    def outer():
        polyprof.instant("mark")
        return leaf(1) + fib(3)

    groups = ["cpu", "simdev"] if device else ["cpu"]
    with polyprof.profile(groups, registry=registry, flush_interval_s=None) as prof:
        assert outer() == 4
        with pytest.raises(KeyError, match="boom"):
            fails()
        sim.launch("k_none")
        polyprof.instant("outside")
        rows, names, _ = annotations.snapshot(annotations.recorder.buffer())
    assert leaf(5) == 6 and fib(4) == 3
    name_of = dict(zip(rows[:, 3].tolist(), names, strict=True)) | {0: None}
    parents = sorted((name, name_of[parent]) for name, parent in zip(names, rows[:, 4].tolist(), strict=True))
    assert parents == sorted([
        ("outer", None), ("mark", "outer"), ("leaf", "outer"), ("in leaf 1", "leaf"), ("fib", "outer"),
        ("fib", "fib"), ("fib", "fib"), ("fib", "fib"), ("fib", "fib"), ("fails", None), ("leaf", "fails"),
        ("in leaf 0", "leaf"), ("outside", None),
    ]), "each span's parent, as recorded"
    trace = prof.trace
    spans = sorted(trace.activities_of(ActivityKind.USER_ANNOTATION), key=lambda a: (a.start, -a.end))
    assert [(a.name, a.args) for a in spans] == [
        ("outer", {}), ("leaf", {"k": 1}), ("fib", {}), ("fib", {}), ("fib", {}), ("fib", {}), ("fib", {}),
        ("fails", {"args": "s"}), ("leaf", {"k": 1}),
    ]
    assert all(a.end >= a.start for a in spans) and len({a.correlation for a in spans}) == len(spans)
    outer_span, fails_span = spans[0], spans[7]
    assert all(outer_span.start <= a.start <= a.end <= outer_span.end for a in spans[1:7])
    assert fails_span.start <= spans[8].start <= spans[8].end <= fails_span.end
    instants = {a.name: a.external_id for a in trace.activities_of(ActivityKind.INSTANT)}
    assert instants == {
        "mark": outer_span.correlation, "in leaf 1": spans[1].correlation, "in leaf 0": spans[8].correlation,
        "outside": 0,
    }
    if device:
        by_name = {k.name: k.external_id for k in trace.activities_of(ActivityKind.KERNEL)}
        assert by_name == {"k1": spans[1].correlation, "k0": spans[8].correlation, "k_none": 0}
        session = sim.sessions[0]
        assert [k for _, k in session.pushed] == ["annotation"] * 9 and session.stack == []
        assert [ext for _, _, ext, *_ in session.launches] == [spans[1].correlation, spans[8].correlation, 0]


def _signatures():
    """Functions of every parameter kind, each returning what it was given."""
    shared = []

    def plain(a, b):
        return a, b

    def defaults(a, b=2, c=shared):
        return a, b, c

    def keyword_only(a, *, k, m=4):
        return a, k, m

    def positional_only(p, q=1, /, r=2):
        return p, q, r

    def star(a, *rest, **named):
        return a, rest, named

    def wrapper_names(span_fn, span_id, recorder, fn=None):  # the wrapper's own names, as parameters
        return span_fn, span_id, recorder, fn

    return [plain, defaults, keyword_only, positional_only, star, wrapper_names, lambda: "none"]


_CALLS = [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((1,), {"b": 5}), ((), {"a": 1, "b": 2}),
          ((1,), {"k": 3}), ((1,), {"k": 3, "m": 6}), ((1, 2), {"r": 7}), ((1,), {"q": 2}),
          ((1, 2), {"x": 9}), ((), {"span_fn": 1, "span_id": 2, "recorder": 3}), ((1, 2, 3), {"fn": 4})]


def test_a_decorated_span_takes_exactly_the_functions_own_arguments(registry):
    """Whatever the parameters (defaults, keyword-only, positional-only, *args/**kwargs, names the
    pure-Python wrapper uses itself), a decorated call returns what the function returns, a call that
    does not fit raises the function's own TypeError, and each call that ran the function is a span.
    (A call that does not fit raises inside its span in C, and before it opens where the pure-Python
    wrapper takes the function's own parameters.)"""
    for fn in _signatures():
        decorated = polyprof.record_function(fn.__name__)(fn)
        assert decorated.__wrapped__ is fn and decorated.__name__ == fn.__name__
        expected: list = []
        with polyprof.profile(["cpu"], registry=registry, flush_interval_s=None) as prof:
            for call in _CALLS:
                a, kw = call if len(call) == 2 and isinstance(call[1], dict) else (call, {})
                try:
                    want = ("returned", fn(*a, **kw))
                except TypeError as exc:
                    want = ("raised", str(exc))
                try:
                    got = ("returned", decorated(*a, **kw))
                except TypeError as exc:
                    got = ("raised", str(exc))
                assert got == want, (fn.__name__, call)
                expected += [fn.__name__] if want[0] == "returned" else []
        ran = [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)]
        assert set(ran) == {fn.__name__}, fn.__name__
        assert len(ran) in (len(expected), len(_CALLS)), "a span for each call that ran, and a bad call one way"
    _, defaults, *_ = _signatures()
    assert polyprof.record_function("d")(defaults)(1)[2] is defaults.__defaults__[1], "a default is the same object"


@pytest.mark.parametrize("span", [polyprof.record_function, _with_block], ids=["decorator", "with"])
def test_a_decorated_call_open_across_flushes_or_the_stop_is_a_span_written_once(registry, span):
    """A call open through two flushes comes once and whole; one open when the profile stops comes
    unfinished, up to the window's end, and its return after the stop records nothing more."""
    import time

    backend = _FlushingBackend()
    registry.register(backend)

    @span("across", {"k": 1})
    def across():
        deadline = time.monotonic() + 5
        while backend.session.flushes < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        polyprof.instant("mark")

    with polyprof.profile(["cpu", "flushy"], registry=registry, flush_interval_s=0.02) as prof:
        across()
    (whole,) = prof.trace.activities_of(ActivityKind.USER_ANNOTATION)
    (mark,) = prof.trace.activities_of(ActivityKind.INSTANT)
    assert backend.session.flushes >= 2 and whole.args == {"k": 1}
    assert whole.start <= mark.start <= whole.end and mark.external_id == whole.correlation

    stopping = polyprof.profile(["cpu"], registry=registry)

    @span("stops it")
    def stops_it():
        stopping.stop()
        return "done"

    stopping.start()
    assert stops_it() == "done"
    (unfinished,) = stopping.trace.activities
    assert unfinished.args == {"finished": False} and unfinished.end == stopping.trace.window[1]


def test_instants_and_counters(registry):
    with polyprof.profile(["cpu"], registry=registry) as prof:
        with polyprof.record_function("outer"):
            polyprof.instant("mark", {"k": 1})
        polyprof.counter("depth", 3)
        polyprof.counter("depth", 5)
    trace = prof.trace
    (mark,) = trace.activities_of(ActivityKind.INSTANT)
    (outer,) = trace.activities_of(ActivityKind.USER_ANNOTATION)
    assert mark.args == {"k": 1} and mark.external_id == outer.correlation
    assert [s.value for s in trace.counters.samples] == [3.0, 5.0]


def test_recording_is_off_outside_a_profile(registry):
    with polyprof.record_function("before"):
        pass
    with polyprof.profile(["cpu"], registry=registry) as prof:
        pass
    with polyprof.record_function("after"):
        pass
    assert len(prof.trace.activities) == 0


def test_record_function_string_args_like_torch(registry):
    with polyprof.profile(["cpu"], registry=registry) as prof:
        with polyprof.record_function("x", "some args"):
            pass
    assert prof.trace.activities.row(0).args == {"args": "some args"}


def test_custom_registry_without_entry_points_has_no_cpu():
    reg = Registry(use_entry_points=False, use_env=False)
    with pytest.raises(polyprof.UnknownNameError, match="none installed"):
        polyprof.profile(["cpu"], registry=reg)


def test_launches_get_the_innermost_enclosing_op_by_time_containment(registry):
    """An op backend that cannot push ids (like torch) still becomes the External id of the device
    work launched inside it, and the flow partner follows."""
    from polyprof.model import ActivityKind as K

    class OpsSession:
        def __init__(self, ctx):
            self.ctx = ctx

        def prepare(self): ...
        def start(self): ...
        def stop(self): ...
        def close(self): ...

        def collect(self, sink):
            host, ws = sink.host_device(), self.ctx.window_start
            t = sink.host_thread(threading.get_native_id())
            other = sink.host_thread(999_999)
            gpu = sink.device("g:0", type="sim")
            q = sink.resource(gpu, 1)
            sink.activity(
                K.CPU_OP,
                "aten::outer",
                device=host,
                resource=t,
                start=ws + 100,
                end=ws + 1000,
                correlation=501,
            )
            sink.activity(
                K.CPU_OP,
                "aten::inner",
                device=host,
                resource=t,
                start=ws + 200,
                end=ws + 500,
                correlation=502,
            )
            sink.activity(
                K.RUNTIME,
                "launch",
                device=host,
                resource=t,
                start=ws + 300,
                end=ws + 400,
                correlation=9,
                flow_id=9,
                flow_start=True,
            )
            sink.activity(
                K.KERNEL, "k", device=gpu, resource=q, start=ws + 450, end=ws + 900, correlation=9, flow_id=9
            )
            sink.activity(
                K.RUNTIME, "late", device=host, resource=t, start=ws + 600, end=ws + 700, correlation=10
            )
            sink.activity(
                K.RUNTIME,
                "elsewhere",
                device=host,
                resource=other,
                start=ws + 300,
                end=ws + 400,
                correlation=11,
            )

    backend = SimDeviceBackend()
    backend.name, backend.activities = "ops", frozenset({"OPS"})
    backend.create_session = lambda config, ctx: OpsSession(ctx)
    registry.register(backend)
    with polyprof.profile(["ops"], registry=registry) as prof:
        pass
    rows = {a.name: a for a in prof.trace.activities}
    assert rows["launch"].external_id == 502 and rows["k"].external_id == 502
    assert rows["late"].external_id == 501
    assert rows["elsewhere"].external_id == 0, "containment is per thread"


def test_spans_open_when_the_profile_stops_are_written_unfinished(registry):
    outer = polyprof.record_function("still running")
    prof = polyprof.profile(["cpu"], registry=registry)
    prof.start()
    outer.__enter__()
    with polyprof.record_function("done"):
        pass
    prof.stop()
    outer.__exit__(None, None, None)  # closing after stop records nothing more
    rows = {a.name: a for a in prof.trace.activities}
    assert rows["done"].args == {}
    assert rows["still running"].args == {"finished": False}
    assert rows["still running"].end == prof.trace.window[1]
    with polyprof.profile(["cpu"], registry=registry) as again:
        pass
    assert len(again.trace.activities) == 0, "an unfinished span does not leak into the next profile"


class _OwnIdsSession(fake_backends.SimDeviceSession):
    """A device backend numbering its correlations itself from 1, as CUPTI and OpenCL backends do."""

    next_id = 0

    def launch(self, name: str) -> None:
        super().launch(name)
        if self.launches:
            self.next_id += 1
            self.launches[-1] = (self.launches[-1][0], self.next_id, *self.launches[-1][2:])


class _OwnIdsBackend(SimDeviceBackend):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.activities = frozenset({name.upper()})

    def create_session(self, config, ctx):
        s = _OwnIdsSession(ctx)
        self.sessions.append(s)
        return s


def _three_steps_of(registry, first, first_prefix: str, second, second_prefix: str):
    """Register both backends (in this order) and profile three annotated steps launching on each."""
    registry.register(first)
    registry.register(second)
    with polyprof.profile(["cpu", first.name, second.name], registry=registry) as prof:
        for i in range(3):
            with polyprof.record_function(f"step{i}"):
                first.launch(f"{first_prefix}{i}")
                second.launch(f"{second_prefix}{i}")
    return prof.trace


def test_flow_ids_stay_correlation_ids_unless_backends_collide(registry):
    """Kineto's convention (ac2g id = correlation id) holds for a device backend whose ids collide with
    no other's; a second one numbering from 1 too is shifted so that every flow still pairs its own
    launch and kernel. Backends without flows (host) shift nothing."""
    trace = _three_steps_of(registry, _OwnIdsBackend("simone"), "one", _OwnIdsBackend("simtwo"), "two")
    kernels = trace.activities_of(ActivityKind.KERNEL)
    launches = {r.flow_id: r for r in trace.activities_of(ActivityKind.RUNTIME) if r.flow_start}
    assert len(kernels) == 6 and len(launches) == 6, "no two flows share an id"
    kept = [
        all(k.flow_id == k.correlation for k in kernels if k.name.startswith(prefix))
        for prefix in ("one", "two")
    ]
    assert sorted(kept) == [False, True], "exactly one of the colliding backends is shifted"
    for k in kernels:
        assert launches[k.flow_id].correlation == k.correlation, f"{k.name}'s flow leads from its own launch"


class _FlowlessSession(fake_backends.SimDeviceSession):
    """A backend whose rows link nothing (a counter sampler, say): it must shift no one's flow ids."""

    def collect(self, sink):
        dev = sink.device("sampler:0", type="sampler", index=0, name="Sampler")
        res = sink.resource(dev, 0, "samples")
        for name, *_ in self.launches:
            sink.activity(
                ActivityKind.KERNEL,
                name,
                device=dev,
                resource=res,
                start=self.ctx.clock(),
                end=self.ctx.clock(),
            )


class _FlowlessBackend(_OwnIdsBackend):
    def create_session(self, config, ctx):
        s = _FlowlessSession(ctx)
        self.sessions.append(s)
        return s


def test_a_device_backend_after_flowless_ones_keeps_its_correlation_ids_as_flow_ids(registry):
    # the sampler is registered, so collected, before the device backend
    trace = _three_steps_of(registry, _FlowlessBackend("sampler"), "sample", _OwnIdsBackend("simone"), "k")
    order = list(trace.backends)
    assert order.index("sampler") < order.index("simone"), "the flowless backend is merged first"
    kernels = [k for k in trace.activities_of(ActivityKind.KERNEL) if k.name.startswith("k")]
    assert [(k.flow_id, k.correlation) for k in kernels] == [(1, 1), (2, 2), (3, 3)]


def test_postprocessing_time_is_reported_per_backend_and_phase(registry, sim):
    """Where the time between stop and a trace went, so a slow stop names its culprit."""
    with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
        sim.launch("k")
    took = json.loads(dumps_chrome_trace(prof.trace))["polyprof"]["postprocess_ms"]
    assert {"host", "torch", "simdev", "merge", "window_end_call"} <= set(took)
    assert {"stop", "collect"} <= set(took["simdev"])
    assert prof.trace.backends["simdev"].timings_ms["collect"] == took["simdev"]["collect"], "one owner"
    assert all(v >= 0 for phases in (took["simdev"], took["host"]) for v in phases.values())
    assert took["merge"] > 0


def test_backends_stop_in_the_reverse_order_they_started(registry):
    """Last started, first stopped: a backend started inside another's session stops while the outer
    one still runs (polyprof's CUDA tracing inside torch's collector, which takes CUPTI)."""
    log = []

    class Logged(fake_backends.SimDeviceSession):
        def start(self):
            log.append(("start", self.label))
            super().start()

        def stop(self):
            log.append(("stop", self.label))
            super().stop()

    class LoggedBackend(_OwnIdsBackend):
        def create_session(self, config, ctx):
            s = Logged(ctx)
            s.label = self.name
            return s

    for name in ("outer", "inner"):
        registry.register(LoggedBackend(name))
    with polyprof.profile(["outer", "inner"], registry=registry):
        pass
    starts = [name for what, name in log if what == "start"]
    stops = [name for what, name in log if what == "stop"]
    assert starts == ["outer", "inner"] and stops == ["inner", "outer"]


def test_device_rows_never_on_thread_id_zero(registry):
    """A backend's device row 0 is renumbered: Perfetto takes tid 0 for the process's own track."""

    class Backend:
        name, api_version, activities = "rowzero", 1, frozenset({"RZ"})

        def probe(self):
            return polyprof.Availability.yes()

        def create_session(self, config, ctx):
            class S:
                def prepare(self): ...
                def start(self): ...
                def stop(self): ...
                def close(self): ...

                def collect(self, sink):
                    dev = sink.device("rz:0", type="rz", index=0)
                    for rid in (0, 1):
                        res = sink.resource(dev, rid, f"queue {rid}")
                        t = ctx.window_start + 10 + rid
                        sink.activity(ActivityKind.KERNEL, f"k{rid}", device=dev, resource=res, start=t, end=t + 5)

            return S()

    registry.register(Backend())
    with polyprof.profile(["rz"], registry=registry) as prof:
        pass
    rows = {a.name: prof.trace.resources[a.resource] for a in prof.trace.activities}
    assert rows["k1"].id == 1 and rows["k0"].id not in (0, 1) and rows["k0"].name == "queue 0"


class _FlushingSession(SessionBase):
    """Launches are handed over by flush while recording; their kernels only at collect."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.flushes = 0
        self.launch_times = []

    def start(self):
        pass

    def stop(self):
        pass

    def flush(self, sink):
        self.flushes += 1
        host = sink.host_device()
        for i, (at, tid) in enumerate(self.launch_times[:]):
            sink.activity(ActivityKind.RUNTIME, "launch", device=host, resource=sink.host_thread(tid), start=at, end=at + 10,
                          correlation=i + 1, flow_id=i + 1, flow_start=True)
        self.launch_times.clear()

    def collect(self, sink):
        dev = sink.device("flushy:0", type="sim", index=0)
        q = sink.resource(dev, 1)
        for i in range(3):
            sink.activity(ActivityKind.KERNEL, f"k{i}", device=dev, resource=q, start=self.ctx.window_start + 100 + i,
                          end=self.ctx.window_start + 200 + i, correlation=i + 1, flow_id=i + 1)


class _FlushingBackend:
    name, api_version, activities = "flushy", polyprof.API_VERSION, frozenset({"FLUSHY"})

    def probe(self):
        return polyprof.Availability.yes()

    def create_session(self, config, ctx):
        self.session = _FlushingSession(config, ctx)
        return self.session


def test_rows_handed_over_by_flush_while_recording_join_those_of_collect(registry):
    import time

    backend = _FlushingBackend()
    registry.register(backend)
    with polyprof.profile(["cpu", "flushy"], registry=registry, flush_interval_s=0.02) as prof:
        with polyprof.record_function("before the flush"):
            backend.session.launch_times += [(polyprof.plugin.host_ns(), threading.get_native_id()) for _ in range(3)]
        deadline = time.monotonic() + 5
        while backend.session.flushes < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with polyprof.record_function("after it"):
            pass
    trace = prof.trace
    assert backend.session.flushes >= 2
    kernels = trace.activities_of(ActivityKind.KERNEL)
    launches = trace.activities_of(ActivityKind.RUNTIME)
    assert len(launches) == 3 and sorted(k.flow_id for k in kernels) == sorted(r.flow_id for r in launches) == [1, 2, 3]
    names = [a.name for a in trace.activities_of(ActivityKind.USER_ANNOTATION)]
    assert names == ["before the flush", "after it"], "the host backend's flushes lose and repeat nothing"
    assert {a.external_id for a in launches} == {trace.activities_of(ActivityKind.USER_ANNOTATION)[0].correlation}
    assert "flush" in trace.backends["flushy"].timings_ms and "flush" in trace.backends["host"].timings_ms
    assert trace.backends["flushy"].activities == 6


def test_a_span_open_across_flushes_is_written_once_and_whole(registry):
    """A flush hands over what the threads completed; a span open through it (and through the next)
    comes once, whole, with its args, and what was made under it keeps it as parent."""
    import time

    backend = _FlushingBackend()
    registry.register(backend)
    with polyprof.profile(["cpu", "flushy"], registry=registry, flush_interval_s=0.02) as prof:
        with polyprof.record_function("across", {"k": 1}):
            with polyprof.record_function("done before"):
                pass
            deadline = time.monotonic() + 5
            while backend.session.flushes < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            polyprof.instant("mark")
        with polyprof.record_function("after"):
            pass
    trace = prof.trace
    assert backend.session.flushes >= 2 and "flush" in trace.backends["host"].timings_ms
    spans = {a.name: a for a in trace.activities_of(ActivityKind.USER_ANNOTATION)}
    assert len(trace.activities_of(ActivityKind.USER_ANNOTATION)) == 3 and set(spans) == {"across", "done before", "after"}
    across, before, after = spans["across"], spans["done before"], spans["after"]
    assert across.args == {"k": 1}, "complete: not written as unfinished"
    assert across.start <= before.start <= before.end <= across.end <= after.start
    (mark,) = trace.activities_of(ActivityKind.INSTANT)
    assert across.start <= mark.start <= across.end and mark.external_id == across.correlation


def _flusher_in_a_hand_over():
    """A Flusher (1 ms interval) whose first hand-over is in progress until the returned event is set;
    and the list of its hand-overs."""
    from polyprof.engine.sessions import Flusher

    entered, release, calls = threading.Event(), threading.Event(), []

    class SlowSessions:
        def flush(self):
            calls.append(1)
            entered.set()
            release.wait(10)
            return []

    flusher = Flusher(SlowSessions(), 0.001)  # type: ignore[arg-type]
    assert entered.wait(5)
    return flusher, release, calls


def test_the_flushers_join_waits_for_the_hand_over_in_progress_and_none_starts_after_it():
    """The window's collect comes after the flusher's join: a hand-over in progress must finish first
    (its parts and the spill's record of them), and a stopped flusher starts no other."""
    import time

    flusher, release, calls = _flusher_in_a_hand_over()
    flusher.stop()
    joined = threading.Event()
    waiter = threading.Thread(target=lambda: (flusher.join(5), joined.set()))
    waiter.start()
    assert not joined.wait(0.1), "join returned while a hand-over was in progress"
    release.set()
    assert joined.wait(5)
    waiter.join()
    time.sleep(0.05)  # 50 of the flusher's intervals
    assert len(calls) == 1, "a stopped flusher handed over again"


def test_a_forked_child_does_not_wait_for_its_parents_hand_over():
    """A child forked during a hand-over inherits the flusher's lock held by a thread it does not have:
    its stop must not wait out the join's time limit for it."""
    import os
    import time

    flusher, release, _ = _flusher_in_a_hand_over()
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 when the join came back at once
        started = time.monotonic()
        flusher.stop()
        flusher.join(30)
        os._exit(0 if time.monotonic() - started < 10 else 1)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        flusher.stop()
        flusher.join(5)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's join waited for a hand-over it does not have"


@pytest.mark.parametrize("attempt", range(3))
def test_a_span_closing_while_the_profile_stops_is_written_once(registry, attempt):
    """Under heavy thread switching, spans close between the recorder's end and the hand-over of their
    thread's events: each is written exactly once (complete, or unfinished up to the window's end)."""
    import sys

    stop = threading.Event()

    def churn():
        while not stop.is_set():
            with polyprof.record_function("churn"):
                pass

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        workers = [threading.Thread(target=churn) for _ in range(3)]
        prof = polyprof.profile(["cpu"], registry=registry)
        prof.start()
        for w in workers:
            w.start()
        time_limit = threading.Event()
        time_limit.wait(0.05)
        prof.stop()
        stop.set()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(old)
    ids = [a.correlation for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)]
    assert ids and len(ids) == len(set(ids))


def test_what_used_to_be_dropped_or_ignored_without_a_word(registry, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="activities is empty"):
        polyprof.profile([], registry=registry)
    with pytest.raises(ConfigError, match=r"backend_options\['host'\] must be a dict"):
        polyprof.profile(["cpu"], registry=registry, backend_options={"host": 5})
    with pytest.raises(ConfigError, match=r"host: unknown option\(s\) \['nope'\]"):
        polyprof.profile(["cpu"], registry=registry, backend_options={"host": {"nope": 1}})
    # a POLYPROF_BACKENDS entry that cannot be loaded: warned about, and failed in the trace
    monkeypatch.setenv("POLYPROF_BACKENDS", "no_such_module_polyprof:backend")
    env_registry = Registry(use_entry_points=True, use_env=True)
    with pytest.warns(polyprof.PolyprofWarning, match="no_such_module_polyprof:backend.*is left out"):
        prof = polyprof.profile(["cpu"], registry=env_registry)
    with prof:
        pass
    status = prof.trace.backends["no_such_module_polyprof:backend"]
    assert status.state == "failed" and "no_such_module_polyprof" in status.reason


class _SlowFlushSession(_FlushingSession):
    """Its hand-over holds its rows until `release` is set (a hand-over that takes its time)."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.inside, self.release = threading.Event(), threading.Event()

    def flush(self, sink):
        if self.launch_times:
            self.inside.set()
            self.release.wait(10)
        super().flush(sink)


def test_a_dump_during_a_hand_over_waits_for_its_rows(registry, tmp_path):
    """The flusher's hand-over holds the session; a dump at that moment used to skip it and miss every
    row the hand-over was taking (the flight recorder's capture of a slow step without its operators)."""
    class SlowFlushingBackend(_FlushingBackend):
        def create_session(self, config, ctx):
            self.session = _SlowFlushSession(config, ctx)
            return self.session

    backend = SlowFlushingBackend()
    registry.register(backend)
    prof = polyprof.profile(["cpu", "flushy"], registry=registry, flush_interval_s=0.02)
    prof.start()
    backend.session.launch_times += [(polyprof.plugin.host_ns(), threading.get_native_id()) for _ in range(3)]
    assert backend.session.inside.wait(10), "the hand-over began"
    threading.Timer(0.3, backend.session.release.set).start()  # it ends while the dump waits
    written = prof.dump(str(tmp_path / "dump.json"))
    prof.stop()
    assert len(polyprof.load_trace(written).activities_of(ActivityKind.RUNTIME)) == 3
