import numpy as np
import pytest

from polyprof.clock import BASE_TIME_GRID_NS, ClockMapping, base_time_ns, epoch_offset, host_ns


def test_host_clock_is_monotonic_ns():
    a = host_ns()
    b = host_ns()
    assert isinstance(a, int) and b >= a


def test_epoch_offset_maps_host_clock_to_wall_clock():
    import time

    off = epoch_offset()
    assert abs(host_ns() + off.offset_ns - time.time_ns()) < 50_000_000
    assert off.uncertainty_ns > 0


def test_base_time_is_on_kinetos_three_month_grid():
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
