from fake_backends import FaultyBackend, SimDeviceBackend

import polyprof
from polyprof.backends.host import backend as host_backend
from polyprof.testing import assert_conforms, check_backend


def test_host_backend_conforms():
    def workload():
        with polyprof.record_function("w"):
            polyprof.instant("i")

    report = assert_conforms(host_backend, workload=workload, require_activities=True)
    assert report.activities == 2 and not report.skipped


def test_sim_device_backend_conforms():
    sim = SimDeviceBackend()
    report = assert_conforms(sim, workload=lambda: sim.launch("k"), require_activities=True)
    assert "device work's External ids are host ids that were pushed" in report.passed
    assert "every flow has a start and an end" in report.passed


def test_kit_catches_a_backend_that_raises():
    report = check_backend(FaultyBackend("bad", fail_in="stop"))
    assert not report.ok
    assert any(
        "stop raises no exception: RuntimeError: injected failure in stop" in f for f in report.failures
    )
    assert any(f.startswith("runs cleanly through the engine") for f in report.failures)


def test_kit_catches_malformed_rows():
    report = check_backend(FaultyBackend("bad", rows="malformed"))
    assert any("emits only valid rows" in f and "end before start: 1" in f for f in report.failures)


def test_kit_catches_a_broken_contract_and_a_silent_unavailable_probe():
    class NoVersion:
        name, activities = "nv", frozenset({"NV"})
        api_version = 2

        def probe(self): ...
        def create_session(self, c, x): ...

    report = check_backend(NoVersion())
    assert report.failures == [
        "follows the backend contract: api_version 2 is not supported: this polyprof speaks version 1"
    ]

    class Silent(SimDeviceBackend):
        name = "silent"
        activities = frozenset({"SILENT"})

        def probe(self):
            return polyprof.Availability(False)

    report = check_backend(Silent())
    assert "an unavailable probe says why: empty reason" in report.failures


def test_kit_catches_timestamps_outside_the_window():
    class Late(SimDeviceBackend):
        name = "late"
        activities = frozenset({"LATE"})

        def create_session(self, config, ctx):
            s = super().create_session(config, ctx)
            real = s.collect

            def collect(sink):
                s.launches = [
                    (n, c, e, t0 + 10**12, t1 + 10**12, tid, st) for n, c, e, t0, t1, tid, st in s.launches
                ]
                real(sink)

            s.collect = collect
            return s

    late = Late()
    report = check_backend(late, workload=lambda: late.launch("k"))
    assert any(f.startswith("activities start inside the capture window") for f in report.failures)


def test_pytest_fixture_is_the_kit(polyprof_conformance):
    assert polyprof_conformance is check_backend
