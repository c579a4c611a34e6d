"""The counters backend: psutil's process and system numbers as counter tracks, on one thread."""

import sys
import threading
import time

import pytest

import polyprof

pytest.importorskip("psutil", reason="needs psutil (polyprof[counters])")


def test_process_and_system_tracks_sampled_while_recording():
    with polyprof.profile(["cpu", "counters"], backend_options={"counters": {"interval_ms": 20}}) as prof:
        assert any(t.name == "polyprof-counters" for t in threading.enumerate())
        keep = [bytearray(1 << 20) for _ in range(40)]  # 40 MB more
        time.sleep(0.3)
    assert not any(t.name == "polyprof-counters" for t in threading.enumerate()), "the thread ends with the window"
    cols, names = prof.trace.counters.columns, prof.trace.counters.strings.strings
    series = {}
    for code, value in zip(cols["name"].tolist(), cols["value"].tolist(), strict=True):
        series.setdefault(names[code], []).append(value)
    assert {"process cpu %", "process rss (MB)", "process threads", "system cpu %", "system memory used %"} <= set(series)
    assert len(series["process rss (MB)"]) >= 8, "about one sample every 20 ms over 0.3 s"
    assert min(series["process rss (MB)"]) > 40 and min(series["process threads"]) >= 2
    assert all(0 <= v <= 100 for v in series["system memory used %"])
    assert prof.trace.backends["counters"].details["samples"] == len(series["process rss (MB)"])
    del keep


def test_a_sample_taken_after_the_windows_end_is_neither_handed_over_nor_counted():
    """The sampling thread may take a sample between the window's end and its stop; the trace keeps no
    counter past the window, so the session neither hands that sample over nor counts it."""
    from polyprof.backends.counters import CountersSession
    from polyprof.plugin.backend import SessionContext
    from polyprof.plugin.clock import host_ns
    from polyprof.plugin.sink import Sink

    ctx = SessionContext("counters", {"interval_ms": 60_000})  # no sample but the first and ours
    session = CountersSession(None, ctx)
    session.start()  # its thread takes the first sample at once
    deadline = time.monotonic() + 5
    while not session.sampler.samples and time.monotonic() < deadline:
        time.sleep(0.005)
    ctx.window_end = host_ns()
    time.sleep(0.001)
    session.sampler.sample_once()  # after the window's end, before the stop
    session.stop()
    sink = Sink("counters")
    session.collect(sink)
    stamps = set(sink.counters.columns["ts"].tolist())
    assert len(stamps) == 1 and max(stamps) <= ctx.window_end
    assert ctx.status.details["samples"] == 1


def test_without_psutil_it_says_how_to_get_it(monkeypatch):
    from polyprof.backends.counters import backend

    monkeypatch.setitem(sys.modules, "psutil", None)
    avail = backend.probe()
    assert not avail.available and "pip install 'polyprof[counters]'" in avail.reason
