import warnings

import pytest

import polyprof
from polyprof import ProfilerAction
from polyprof.engine.schedule import TRANSITIONS
from polyprof.errors import ConfigError

A = ProfilerAction


def test_docstring_example():
    s = polyprof.schedule(wait=1, warmup=1, active=2, repeat=1)
    assert [s(i) for i in range(6)] == [A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE, A.NONE]


def test_skip_first_and_skip_first_wait():
    s = polyprof.schedule(wait=2, warmup=1, active=1, skip_first=3, skip_first_wait=1)
    assert [s(i) for i in range(8)] == [A.NONE] * 3 + [A.WARMUP, A.RECORD_AND_SAVE, A.NONE, A.NONE, A.WARMUP]


def test_repeat_zero_cycles_forever():
    s = polyprof.schedule(wait=0, warmup=1, active=1)
    assert [s(i) for i in range(100, 104)] == [A.WARMUP, A.RECORD_AND_SAVE] * 2


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(wait=-1, warmup=1, active=1), "wait"),
        (dict(wait=0, warmup=1, active=0), "active"),
        (dict(wait=0, warmup=1, active=1, repeat=-2), "repeat"),
        (dict(wait=0, warmup=1.5, active=1), "warmup"),
    ],
)
def test_invalid_values_are_rejected_before_anything_starts(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        polyprof.schedule(**kwargs)


def test_zero_warmup_warns_like_torch():
    with pytest.warns(UserWarning, match="won't be using warmup"):
        polyprof.schedule(wait=0, warmup=0, active=1)


def test_transition_table_is_torchs():
    assert TRANSITIONS[(A.NONE, A.RECORD)] == ("prepare", "start")
    assert TRANSITIONS[(A.RECORD_AND_SAVE, A.RECORD)] == ("stop", "ready", "prepare", "start")
    assert TRANSITIONS[(A.WARMUP, None)] == ("start", "stop")
    assert len(TRANSITIONS) == 20


def run_steps(sched, steps, registry):
    ready = []

    def on_ready(p):
        ready.append((p.step_num, sorted({r.name for r in p.trace.activities})))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with polyprof.profile(["cpu"], schedule=sched, on_trace_ready=on_ready, registry=registry) as prof:
            for step in range(steps):
                with polyprof.record_function(f"work{step}"):
                    pass
                prof.step()
    return ready


def test_schedule_drives_cycles_and_step_markers(registry):
    ready = run_steps(polyprof.schedule(wait=1, warmup=1, active=2, repeat=2), 10, registry)
    assert ready == [
        (4, ["ProfilerStep#2", "ProfilerStep#3", "work2", "work3"]),
        (8, ["ProfilerStep#6", "ProfilerStep#7", "work6", "work7"]),
    ]


def test_exit_while_recording_delivers_the_partial_cycle(registry):
    ready = run_steps(polyprof.schedule(wait=0, warmup=1, active=5, repeat=1), 3, registry)
    assert ready == [(3, ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3", "work1", "work2"])]


def test_without_schedule_records_start_to_stop_without_step_markers(registry):
    ready = []
    with polyprof.profile(["cpu"], on_trace_ready=lambda p: ready.append(p.trace), registry=registry) as prof:
        with polyprof.record_function("a"):
            pass
        prof.step()
    assert len(ready) == 1 and [r.name for r in ready[0].activities] == ["a"]
