import numpy as np
import pytest

from polyprof.plugin.clock import BASE_TIME_GRID_NS, ClockMapping, base_time_ns, epoch_offset, host_ns


def test_host_clock_is_monotonic_ns():
    a = host_ns()
    b = host_ns()
    assert isinstance(a, int) and b >= a


def test_epoch_offset_maps_host_clock_to_wall_clock():
    import time

    off = epoch_offset()
    assert abs(host_ns() + off.offset_ns - time.time_ns()) < 50_000_000
    assert off.uncertainty_ns > 0


def test_base_time_is_the_start_floored_to_its_utc_day():
    t = 1_790_000_123_456_789_000
    b = base_time_ns(t)
    assert b <= t < b + BASE_TIME_GRID_NS and b % BASE_TIME_GRID_NS == 0


def test_fit_recovers_offset_and_drift_exactly_without_noise():
    dev = (
        np.array([0, 1_000_000_000, 2_000_000_000, 5_000_000_000], dtype=np.int64) + 1_700_000_000_000_000_000
    )
    host = 123_456_789 + ((dev - dev[0]) * (1 + 50e-6)).astype(np.int64)  # 50 ppm fast
    m = ClockMapping.fit(dev, host)
    assert m.drift_ppm == pytest.approx(50, abs=0.01)
    assert m.residual_ns < 2
    probe = int(dev[0]) + 3_000_000_000
    assert m.to_host(probe) == pytest.approx(123_456_789 + 3_000_000_000 * (1 + 50e-6), abs=2)


def test_fit_with_noise_reports_residual_and_keeps_ns_precision_on_19_digit_timestamps():
    rng = np.random.default_rng(1)
    dev = 1_790_000_000_000_000_000 + np.sort(rng.integers(0, 10_000_000_000, 50))
    true_host = (dev - dev[0]) + 42_000
    noise = rng.normal(0, 300, len(dev)).astype(np.int64)
    m = ClockMapping.fit(dev, true_host + noise)
    assert 300 <= m.residual_ns < 2000, "the residual reflects the noise"
    mapped = m.to_host(dev)
    assert mapped.dtype == np.int64
    assert np.max(np.abs(mapped - true_host)) < 400, "the fit is better than the individual noisy pairs"


def test_a_drift_within_the_pairs_noise_is_not_fitted():
    """Two markers 20 ms apart, each bracketed to +-100 us (a loaded CI machine): one read 100 us late
    would fit a 5000 ppm "drift" that throws device work out of its window; the offset is kept instead."""
    dev = [1_000_000_000, 1_020_000_000]
    host = [5_000_000_000, 5_020_100_000]
    m = ClockMapping.fit(dev, host, uncertainty_ns=100_000)
    assert m.slope == 1.0 and m.to_host(1_010_000_000) == 5_010_050_000
    assert m.error_ns <= 150_000, "every pair within its uncertainty plus the residual"


def test_a_drift_larger_than_the_pairs_noise_is_fitted():
    dev = [0, 10_000_000_000]  # 10 s apart, 50 ppm: 500 us of drift against +-100 us pairs
    host = [0, 10_000_500_000]
    m = ClockMapping.fit(dev, host, uncertainty_ns=100_000)
    assert m.drift_ppm == pytest.approx(50, abs=0.01)


def test_one_pair_gives_an_offset_only():
    m = ClockMapping.fit([1000], [5000])
    assert m.slope == 1.0 and m.to_host(1500) == 5500 and m.residual_ns == 0


def test_offset_only_fit_ignores_drift():
    m = ClockMapping.fit([0, 1000], [10, 1020], fit_drift=False)
    assert m.slope == 1.0 and m.to_host(0) == 15 and m.residual_ns == 5


def test_identity_and_json():
    m = ClockMapping.identity()
    assert m.to_host(123) == 123
    assert ClockMapping.fit([0, 10], [100, 110], uncertainty_ns=7).to_json()["offset_ns"] == 100


@pytest.mark.parametrize("dev,host", [([], []), ([1, 2], [1])])
def test_fit_rejects_bad_input(dev, host):
    with pytest.raises(ValueError):
        ClockMapping.fit(dev, host)


@pytest.mark.skipif(__import__("polyprof._native", fromlist=["extension"]).extension is None,
                    reason="needs polyprof's C extension (built by setup.sh)")
def test_the_recorders_clock_reads_clock_monotonic_whether_through_the_tsc_or_not():
    """The recorder's clock (the TSC scaled to CLOCK_MONOTONIC where the kernel's clocksource is the
    TSC) against clock_gettime read around it: 200,000 reads over ~0.3 s and across sleeps (the pair is
    taken again each millisecond, the rate measured over the first 2 ms and on), each between the
    reads before and after it, and never going back."""
    import time

    from polyprof._native import extension as speedups

    before, during, after = [], [], []
    for i in range(200_000):
        if i % 50_000 == 0:
            time.sleep(0.005)
        before.append(speedups.now_ns())
        during.append(speedups.clock_ns())
        after.append(speedups.now_ns())
    b, d, a = np.array(before), np.array(during), np.array(after)
    assert (d >= b).all() and (d <= a).all(), (int((b - d).max()), int((d - a).max()), speedups.clock_source())
    assert (np.diff(d) >= 0).all()
    assert speedups.clock_source() in ("tsc", "clock_gettime")


def test_polyprof_clock_gettime_turns_the_tsc_path_off():
    import subprocess
    import sys

    code = "from polyprof import _native; print(_native.clock_source())"
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "POLYPROF_CLOCK": "gettime"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "clock_gettime"


def test_a_trace_takes_the_jobs_base_within_its_reach_and_its_own_day_beyond():
    from polyprof.plugin.clock import BASE_TIME_GRID_NS, JOB_BASE_REACH_NS, base_time_ns, job_base_time_ns

    midnight = 20_000 * BASE_TIME_GRID_NS
    offered = job_base_time_ns(midnight + 10**9)  # rank 0 one second past midnight
    assert offered == midnight - BASE_TIME_GRID_NS  # an hour back: the day before
    assert base_time_ns(midnight - 60 * 10**9, offered) == offered  # a rank a minute before midnight
    assert base_time_ns(midnight + 10**9, offered) == offered
    assert base_time_ns(offered + JOB_BASE_REACH_NS + 5, offered) == offered + JOB_BASE_REACH_NS  # too far: its day
    assert base_time_ns(offered - 1, offered) == offered - BASE_TIME_GRID_NS  # before the job's base: its own day
    assert base_time_ns(midnight + 5) == midnight
