"""One options object carries a profile's keywords for both front ends (polyprof.profile and the
torch.profiler-compatible polyprof.profiler.profile)."""

import dataclasses
import inspect

import pytest

import polyprof
from polyprof import ProfileOptions
from polyprof.errors import ConfigError
from polyprof.model import ActivityKind


def test_options_object_and_keywords_give_the_same_profile_and_a_keyword_wins(registry):
    options = ProfileOptions(metadata={"run": "a"}, limits={"min_host_span_ns": 5000})
    with polyprof.profile(["cpu"], registry=registry, options=options) as prof:
        with polyprof.record_function("kept"):
            pass
    assert prof.trace.metadata["run"] == "a" and prof.options.limits.min_host_span_ns == 5000
    with polyprof.profile(["cpu"], registry=registry, options=options, metadata={"run": "b"}) as prof:
        pass
    assert prof.trace.metadata["run"] == "b" and prof.options.limits.min_host_span_ns == 5000
    assert options.metadata == {"run": "a"}, "the options object is not changed by a keyword laid over it"


def test_unknown_keyword_names_itself_and_the_keywords_there_are(registry):
    with pytest.raises(TypeError, match=r"'ring_seconds'.*a profile takes: .*ring_s"):
        polyprof.profile(["cpu"], registry=registry, ring_seconds=3)
    with pytest.raises(ConfigError, match="options must be a polyprof.ProfileOptions, got dict"):
        polyprof.profile(["cpu"], registry=registry, options={"ring_s": 3})


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"ring_s": 0}, "ring_s must be a positive number of seconds, got 0"),
        ({"call_timeout_s": float("nan")}, "call_timeout_s must be a positive number of seconds"),
        ({"flush_interval_s": True}, "flush_interval_s must be a positive number of seconds, got True"),
        ({"schedule": 3}, "schedule must be a callable step -> ProfilerAction"),
        ({"on_trace_ready": "x.json"}, "on_trace_ready must be callable"),
        ({"limits": {"min_span": 1}}, "unknown limit"),
    ],
)
def test_a_wrong_value_is_refused_when_the_options_are_made(keywords, message):
    with pytest.raises(ConfigError, match=message):
        ProfileOptions(**keywords)


def test_flush_interval_follows_spill_and_ring(tmp_path):
    assert ProfileOptions().flush_every_s == 10.0
    assert ProfileOptions(spill=tmp_path / "s").flush_every_s == 1.0, "with a spill: every second"
    assert ProfileOptions(spill=tmp_path / "s", flush_interval_s=3).flush_every_s == 3.0, "unless set"
    assert ProfileOptions(ring_s=2).flush_every_s == 0.5, "four hand-overs per ring"
    ring = ProfileOptions(ring_s=2)
    assert dataclasses.replace(ring, ring_s=None).flush_every_s == 10.0, "a copy derives it again"
    assert ProfileOptions(spill="rel.spill").spill == str(tmp_path.cwd() / "rel.spill")


def test_signature_lists_every_keyword():
    params = inspect.signature(polyprof.Profile).parameters
    assert set(ProfileOptions.names()) | {"activities", "options"} == set(params)
    assert params["call_timeout_s"].default == ProfileOptions().call_timeout_s


def test_torch_front_end_takes_the_same_options_and_its_own_keyword_wins(registry):
    pytest.importorskip("torch", reason="the torch.profiler-compatible front end needs torch")
    from polyprof.profiler import profile

    seen = []
    options = ProfileOptions(
        registry=registry,
        metadata={"run": "torch"},
        schedule=polyprof.schedule(wait=0, warmup=1, active=1, repeat=1),
        on_trace_ready=lambda p: seen.append(("options", p.step_num)),
    )
    with profile(activities=[polyprof.ProfilerActivity.CPU], options=options) as prof:
        for _ in range(3):
            with polyprof.record_function("step_work"):
                pass
            prof.step()
    assert seen == [("options", 2)], "the options object's schedule and handler ran"
    assert prof.trace.metadata["run"] == "torch"
    assert any(a.name == "step_work" for a in prof.trace.activities_of(ActivityKind.USER_ANNOTATION))
    with profile(activities=[polyprof.ProfilerActivity.CPU], options=options,
                 on_trace_ready=lambda p: seen.append(("keyword", p.step_num))) as prof:
        prof.step()
        prof.step()
    assert seen[-1] == ("keyword", 2), "torch's own keyword wins over the options object's"
    with pytest.raises(TypeError, match="'ring_seconds'"):
        profile(activities=[polyprof.ProfilerActivity.CPU], registry=registry, ring_seconds=1)
