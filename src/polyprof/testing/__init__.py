"""The conformance kit: checks a backend against contract v1.

::

    from polyprof.testing import check_backend

    def test_my_backend_conforms():
        report = check_backend(my_backend, workload=run_some_kernels)
        assert report.ok, report.explain()

With pytest, the ``polyprof_conformance`` fixture (from polyprof's pytest plugin) is the same function.
"""

from polyprof.testing.conformance import ConformanceReport, assert_conforms, check_backend

__all__ = ["ConformanceReport", "assert_conforms", "check_backend"]
