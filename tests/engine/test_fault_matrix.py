"""A faulty backend never takes a profile down: the host backend's events are all written, and the
failure is in the trace's metadata under the faulty backend's name."""

import json

import pytest
from fake_backends import HANG_RELEASE, FaultyBackend

import polyprof
from polyprof.formats import dumps_chrome_trace
from polyprof.model import ActivityKind

N_ANNOTATIONS = 50


def profile_with(registry, backend, activities=None, timeout=0.5):
    registry.register(backend)
    with (
        pytest.warns(polyprof.PolyprofWarning)
        if backend.fail_in or backend.rows == "malformed"
        else _nothing()
    ):
        with polyprof.profile(activities, registry=registry, call_timeout_s=timeout) as prof:
            for i in range(N_ANNOTATIONS):
                with polyprof.record_function(f"host work {i}"):
                    pass
    trace = prof.trace
    host_rows = [a for a in trace.activities_of(ActivityKind.USER_ANNOTATION)]
    assert len(host_rows) == N_ANNOTATIONS, "every healthy host event is in the trace"
    doc = json.loads(dumps_chrome_trace(trace))
    return trace, doc["polyprof"]["backends"][backend.name]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture(autouse=True, scope="module")
def release_hung_threads():
    yield
    HANG_RELEASE.set()


@pytest.mark.parametrize("method", ["prepare", "start", "stop", "collect", "close", "create_session"])
def test_backend_raising_in_a_lifecycle_method(registry, method):
    backend = FaultyBackend("faulty", fail_in=method, rows="malformed" if method == "close" else None)
    trace, status = profile_with(registry, backend, ["cpu", "faulty"])
    assert any(f"{method}() raised RuntimeError: injected failure in {method}" in e for e in status["errors"])
    if method in ("prepare", "start", "create_session", "collect"):
        assert status["state"] == "failed"


def test_backend_raising_in_probe_is_unavailable_and_recorded(registry):
    backend = FaultyBackend("faulty", fail_in="probe")
    registry.register(backend)
    with polyprof.profile(registry=registry) as prof:  # default activities: everything available
        for i in range(N_ANNOTATIONS):
            with polyprof.record_function(f"host work {i}"):
                pass
    assert len(prof.trace.activities_of(ActivityKind.USER_ANNOTATION)) == N_ANNOTATIONS
    status = json.loads(dumps_chrome_trace(prof.trace))["polyprof"]["backends"]["faulty"]
    assert status["state"] == "unavailable"
    assert status["reason"] == "probe() raised RuntimeError: injected failure in probe"
    with pytest.raises(polyprof.BackendUnavailableError, match="injected failure in probe"):
        polyprof.profile(["faulty"], registry=registry)


@pytest.mark.parametrize("method", ["create_session", "prepare", "start", "stop", "collect", "close"])
def test_backend_hanging_in_any_call_is_abandoned_after_the_time_limit(registry, method):
    import time

    t0 = time.monotonic()
    backend = FaultyBackend("faulty", fail_in=method, mode="hang")
    trace, status = profile_with(registry, backend, ["cpu", "faulty"], timeout=0.3)
    assert time.monotonic() - t0 < 5, "the profile does not wait for the hung backend"
    assert any(f"{method}() did not return within 0.3 s and was abandoned" in e for e in status["errors"])
    if method in ("create_session", "prepare", "start", "collect"):
        assert status["state"] == "failed"


def test_a_probe_that_hangs_makes_the_backend_unavailable_with_the_reason(registry, monkeypatch):
    import time

    from polyprof.engine import registry as registry_module

    monkeypatch.setattr(registry_module, "PROBE_TIMEOUT_S", 0.3)
    registry.register(FaultyBackend("faulty", fail_in="probe", mode="hang"))
    t0 = time.monotonic()
    with polyprof.profile(registry=registry) as prof:
        with polyprof.record_function("work"):
            pass
    assert time.monotonic() - t0 < 5
    status = prof.trace.backends["faulty"]
    assert status.state == "unavailable" and "probe() did not return within 0.3 s" in status.reason


@pytest.mark.parametrize("method", ["probe", "create_session", "prepare", "start", "stop", "collect"])
def test_keyboard_interrupt_inside_a_backend_is_its_failure_not_the_programs(registry, method):
    backend = FaultyBackend("faulty", fail_in=method, mode="interrupt")
    registry.register(backend)
    with pytest.warns(polyprof.PolyprofWarning) if method != "probe" else _nothing():  # probe: unavailable
        with polyprof.profile(registry=registry) as prof:
            with polyprof.record_function("the program goes on"):
                pass
    status = prof.trace.backends["faulty"]
    assert [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)] == ["the program goes on"]
    assert "KeyboardInterrupt" in (status.reason if method == "probe" else " ".join(status.errors))


def test_a_backend_that_hung_once_gets_no_session_in_later_windows(registry):
    backend = FaultyBackend("faulty", fail_in="stop", mode="hang")
    registry.register(backend)
    sched = polyprof.schedule(wait=0, warmup=1, active=1, repeat=3)
    with pytest.warns(polyprof.PolyprofWarning):
        with polyprof.profile(["cpu", "faulty"], registry=registry, schedule=sched, call_timeout_s=0.3) as prof:
            for _ in range(6):
                prof.step()
    assert backend.sessions_created == 1, "no new session (and no new abandoned thread) per cycle"
    status = prof.trace.backends["faulty"]
    assert status.state == "failed" and "left out of later windows" in status.reason


def test_malformed_rows_are_rejected_and_counted(registry):
    backend = FaultyBackend("faulty", rows="malformed")
    trace, status = profile_with(registry, backend, ["cpu", "faulty"])
    kernels = trace.activities_of(ActivityKind.KERNEL)
    assert [k.name for k in kernels] == ["ok"]
    assert status["rejected"] == 4
    assert status["rejected_reasons"] == {
        "end before start": 1,
        "unknown device": 1,
        "invalid kind or timestamp (TypeError)": 1,
        "unknown resource": 1,
    }


def test_a_million_rows(registry):
    backend = FaultyBackend("faulty", rows="million")
    trace, status = profile_with(registry, backend, ["cpu", "faulty"], timeout=120)
    assert status == {"state": "ran", "activities": 1_000_000}
    assert int((trace.activities["kind"] == int(ActivityKind.KERNEL)).sum()) == 1_000_000


def test_correlation_push_that_raises_is_disabled_not_fatal(registry):
    from fake_backends import SimDeviceBackend

    class BadPush(SimDeviceBackend):
        name = "badpush"
        activities = frozenset({"BADPUSH"})

        def create_session(self, config, ctx):
            s = super().create_session(config, ctx)

            def push(ident, kind):
                raise ValueError("push exploded")

            s.push_correlation = push
            return s

    registry.register(BadPush())
    with pytest.warns(polyprof.PolyprofWarning, match="push exploded"):
        with polyprof.profile(["cpu", "badpush"], registry=registry) as prof:
            for _ in range(3):
                with polyprof.record_function("a"):
                    pass
    assert len(prof.trace.activities_of(ActivityKind.USER_ANNOTATION)) == 3
    errors = prof.trace.backends["badpush"].errors
    assert len(errors) == 1 and "correlation disabled" in errors[0]


def test_guarded_calls_reuse_one_thread_until_a_call_hangs():
    import threading

    from polyprof.engine.guard import run_with_timeout

    first = run_with_timeout(threading.get_ident, timeout_s=5)
    second = run_with_timeout(threading.get_ident, timeout_s=5)
    assert first.ok and second.ok and first.value == second.value != threading.get_ident()
    release = threading.Event()
    hung = run_with_timeout(release.wait, timeout_s=0.05)
    assert hung.timed_out
    after = run_with_timeout(threading.get_ident, timeout_s=5)
    assert after.ok and after.value != first.value  # a fresh thread: the old one is still stuck
    release.set()
    failed = run_with_timeout(lambda: 1 / 0, timeout_s=5)
    assert not failed.ok and isinstance(failed.value, ZeroDivisionError)
