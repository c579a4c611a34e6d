"""Merge and write run on the background writer: the call that ends a window returns at once, the
trace and the handler's file are there when the user waits for them, at exit too."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

import polyprof
from polyprof import _native
from polyprof.engine.background import WRITER_THREAD_NAME, writer
from polyprof.errors import ConfigError
from polyprof.model import ActivityKind


class _SlowCollect(polyprof.plugin.SessionBase):
    release = threading.Event()

    def start(self):
        pass

    def stop(self):
        pass

    def collect(self, sink):
        _SlowCollect.release.wait(10)


class _SlowBackend:
    name, api_version, activities = "slow", polyprof.API_VERSION, frozenset({"SLOW"})

    def probe(self):
        return polyprof.Availability.yes()

    def create_session(self, config, ctx):
        return _SlowCollect(config, ctx)


@pytest.fixture
def slow(registry):
    registry.register(_SlowBackend())
    _SlowCollect.release.clear()
    yield registry
    _SlowCollect.release.set()


def test_the_step_that_ends_a_window_does_not_wait_for_collect_merge_or_handler(slow):
    seen = []
    prof = polyprof.profile(["cpu", "slow"], registry=slow, schedule=polyprof.schedule(wait=0, warmup=1, active=1, repeat=1),
                            on_trace_ready=lambda p: seen.append((p.step_num, len(p.trace.activities))))
    prof.start()
    prof.step()  # recording
    with polyprof.record_function("in the window"):
        pass
    prof.step()  # ends it: returns while the slow backend's collect is still running
    assert seen == [] and any(t.name == WRITER_THREAD_NAME for t in threading.enumerate())
    _SlowCollect.release.set()
    for _ in range(50):  # the loop goes on while the handler runs on the writer
        prof.step()
    prof.stop()  # waits for the handler, as torch.profiler's does
    assert seen[0] == (2, 2), "the handler sees its window's step number and trace (span + step marker)"
    assert prof.step_num == 52, "and the training loop's step count is its own"
    assert prof.trace.timings_ms["window_end_call"] < 1000


def test_stop_without_waiting_returns_and_the_trace_waits(slow):
    prof = polyprof.profile(["cpu", "slow"], registry=slow)
    prof.start()
    with polyprof.record_function("x"):
        pass
    prof.stop(wait=False)
    assert prof._jobs and not prof._jobs.jobs[-1].merged.is_set()
    _SlowCollect.release.set()
    assert [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)] == ["x"]


def test_a_handlers_exception_reaches_the_user_at_the_next_call(registry):
    def handler(p):
        raise ValueError("handler broke")

    prof = polyprof.profile(["cpu"], registry=registry, schedule=polyprof.schedule(wait=0, warmup=1, active=1, repeat=2),
                            on_trace_ready=handler)
    prof.start()
    prof.step()
    prof.step()  # first window ends; its handler fails in the background
    writer.drain()
    with pytest.raises(ValueError, match="handler broke"):
        prof.step()
    prof.stop()


def test_pending_writes_finish_at_interpreter_exit(tmp_path):
    out = tmp_path / "t.json"
    script = textwrap.dedent(
        f"""
        import polyprof
        p = polyprof.profile(["cpu"], schedule=polyprof.schedule(wait=0, warmup=1, active=1),
                             on_trace_ready=lambda p: p.export_chrome_trace({str(out)!r}))
        p.start(); p.step()
        for i in range(100000):
            with polyprof.record_function("work"):
                pass
        p.step()   # the window ends; the program exits without waiting
        """
    )
    env = {**os.environ, "POLYPROF_BACKENDS": ""}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert out.exists() and b'"work"' in out.read_bytes()[:100_000] + out.read_bytes()[-5_000_000:]


def test_dump_writes_what_is_recorded_so_far_and_the_profile_goes_on(registry, tmp_path):
    import json

    prof = polyprof.profile(["cpu"], registry=registry)
    prof.start()
    with polyprof.record_function("before the dump"):
        pass
    written = prof.dump(str(tmp_path / "dump.json"))
    with polyprof.record_function("after it"):
        pass
    prof.stop()
    doc = json.loads(open(written).read())
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
    assert names == ["before the dump"] and doc["polyprof"]["partial"]["ended"] == "a dump while recording"
    assert [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)] == ["before the dump", "after it"]
    with pytest.raises(polyprof.PolyprofError, match="needs a recording window"):
        prof.dump(str(tmp_path / "late.json"))


@pytest.mark.skipif(_native.extension_missing, reason="needs the C recorder (the Python twin's live buffer "
                    "does not keep the spans open across a hand-over)")
def test_a_dump_shows_the_spans_still_open_as_unfinished(registry, tmp_path):
    import time

    prof = polyprof.profile(["cpu"], registry=registry, flush_interval_s=0.05)
    prof.start()
    with polyprof.record_function("stuck", args={"where": "inside"}):
        time.sleep(0.15)  # hand-overs come meanwhile: the open span stays with its thread
        dumped = polyprof.load_trace(prof.dump(str(tmp_path / "dump.json")))
    prof.stop()
    (stuck,) = dumped.activities_of(ActivityKind.USER_ANNOTATION)
    assert stuck.name == "stuck" and stuck.args == {"where": "inside", "finished": False}
    assert stuck.end - stuck.start >= 0.15e9, "open up to the dump"
    (done,) = prof.trace.activities_of(ActivityKind.USER_ANNOTATION)
    assert done.args == {"where": "inside"}, "the span, once ended, is whole in the window's trace"


def test_ring_mode_keeps_the_last_seconds_only(registry):
    import time

    with polyprof.profile(["cpu"], registry=registry, ring_s=0.2) as prof:
        with polyprof.record_function("old"):
            pass
        time.sleep(0.5)
        with polyprof.record_function("recent"):
            pass
    names = [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)]
    assert names == ["recent"]
    assert prof.trace.backends["host"].dropped.get("older than the ring (ring_s)", 0) + \
        prof.trace.backends["host"].dropped.get("outside capture window", 0) >= 1


@pytest.mark.parametrize("scheduled", [False, True], ids=["stop", "windows on the writer"])
def test_a_dropped_profile_and_its_trace_are_freed_without_the_garbage_collector(registry, scheduled):
    """A profile keeps its window jobs, and a job's closure holds the profile: once the job has run the
    closure is let go, so dropping the profile frees it and its traces at once, not at some later
    collection that would land in the user's loop (and keep a large trace's memory until then)."""
    import gc
    import weakref

    traces = []
    gc.collect()
    gc.disable()
    try:
        if scheduled:
            sched = polyprof.schedule(wait=0, warmup=0, active=1, repeat=2)
            keep = lambda p: traces.append(weakref.ref(p.trace))  # noqa: E731
            with polyprof.profile(["cpu"], schedule=sched, on_trace_ready=keep) as prof:
                for _ in range(3):
                    with polyprof.record_function("work"):
                        pass
                    prof.step()
            assert len(traces) == 2
        else:
            with polyprof.profile(["cpu"]) as prof:
                with polyprof.record_function("work"):
                    pass
            traces.append(weakref.ref(prof.trace))
        assert traces[-1]() is not None, "the last window's trace is the profile's"
        profile_ref = weakref.ref(prof)
        del prof
        assert profile_ref() is None, "the profile outlived its last reference (a reference cycle)"
        assert all(t() is None for t in traces), "a trace outlived its profile"
    finally:
        gc.enable()


def test_stop_with_discard_lets_the_window_go_unmerged(registry):
    prof = polyprof.profile(["cpu"], registry=registry)
    prof.start()
    with polyprof.record_function("let go"):
        pass
    prof.stop(discard=True)
    with pytest.raises(polyprof.PolyprofError, match="no trace has been recorded"):
        _ = prof.trace
    with polyprof.profile(["cpu"], registry=registry) as again:  # the recorders are free for the next
        with polyprof.record_function("kept"):
            pass
    assert [a.name for a in again.trace.activities_of(ActivityKind.USER_ANNOTATION)] == ["kept"]


def test_ring_mode_keeps_its_rows_under_ring_mb(registry):
    import time

    from polyprof.merge import RING_MB

    n = 0
    with polyprof.profile(["cpu"], registry=registry, ring_s=60, ring_mb=0.5, flush_interval_s=0.05) as prof:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with polyprof.record_function(f"span{n}"):
                pass
            n += 1
    kept = [int(a.name[4:]) for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)]
    dropped = prof.trace.backends["host"].dropped.get(RING_MB, 0)
    assert dropped > 0 and len(kept) + dropped == n, (len(kept), dropped, n)
    assert kept[-1] == n - 1 and min(kept) > 0, "the newest rows are kept, the oldest let go"
    with pytest.raises(ConfigError, match="ring_mb must be a positive number of megabytes"):
        polyprof.profile(["cpu"], registry=registry, ring_s=1, ring_mb=0)


def test_a_profile_started_again_after_a_discarding_stop_keeps_its_windows(registry):
    prof = polyprof.profile(["cpu"], registry=registry)
    prof.start()
    prof.stop(discard=True)
    prof.start()
    with polyprof.record_function("kept"):
        pass
    prof.stop()
    assert [a.name for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION)] == ["kept"]
