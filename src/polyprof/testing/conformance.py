"""Checks every backend must pass; see :func:`check_backend`."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyprof.engine.guard import GUARD_THREAD_NAME, describe, run_with_timeout
from polyprof.model import BACKEND_RAN, DEVICE_KINDS, ActivityTable
from polyprof.plugin import (
    REQUIRED_SESSION_METHODS,
    ActivityKind,
    Availability,
    ProfileConfig,
    SessionContext,
    Sink,
    contract_problems,
    correlation,
    host_ns,
)
from polyprof.plugin.traits import session_trait_problems


@dataclass
class ConformanceReport:
    backend: str
    passed: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    activities: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    def check(self, condition: bool, name: str, detail: str = "") -> bool:
        if condition:
            self.passed.append(name)
        else:
            self.failures.append(f"{name}: {detail}" if detail else name)
        return condition

    def explain(self) -> str:
        lines = [
            f"conformance of backend {self.backend!r}: {len(self.passed)} passed, {len(self.failures)} failed"
        ]
        lines += [f"  FAIL {f}" for f in self.failures]
        lines += [f"  skip {s}" for s in self.skipped]
        return "\n".join(lines)


def _call(
    report: ConformanceReport, name: str, fn: Callable, *args: Any, timeout_s: float
) -> tuple[bool, Any]:
    outcome = run_with_timeout(fn, *args, timeout_s=timeout_s)
    if outcome.timed_out:
        report.check(False, f"{name} returns in time", f"still running after {timeout_s:g} s")
        return False, None
    if not outcome.ok:
        report.check(False, f"{name} raises no exception", describe(outcome.value))
        return False, None
    report.passed.append(f"{name} raises no exception")
    return True, outcome.value


def check_backend(
    backend: Any,
    *,
    workload: Callable[[], Any] | None = None,
    options: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
    require_activities: bool = False,
) -> ConformanceReport:
    """Drive `backend` through a whole session around `workload` and check what it does and emits.

    Checks: the contract (attributes, api_version, activities); probe returns an Availability, is
    repeatable and starts no threads; the lifecycle prepare/start/stop/collect/close raises nothing
    and returns in time; stop and close are idempotent; correlation push/pop (when implemented)
    balanced around the workload; rows all valid (declared devices and resources, end >= start,
    integer timestamps); starts inside the capture window (within the clock error the backend
    reported) and on the host clock; flows with both ends; device work's External ids among the
    pushed ones; then the same backend run through the real engine ends in state "ran".
    """
    name = getattr(backend, "name", repr(backend))
    report = ConformanceReport(str(name))
    problems = contract_problems(backend)
    if not report.check(not problems, "follows the backend contract", "; ".join(problems)):
        return report

    threads_before = _backend_threads()
    ok, first = _call(report, "probe", backend.probe, timeout_s=timeout_s)
    if not ok:
        return report
    if not report.check(
        isinstance(first, Availability), "probe returns an Availability", f"got {type(first).__name__}"
    ):
        return report
    _, second = _call(report, "probe (again)", backend.probe, timeout_s=timeout_s)
    report.check(
        isinstance(second, Availability) and second.available == first.available,
        "probe is repeatable",
        f"first {first!r}, then {second!r}",
    )
    report.check(
        not (_backend_threads() - threads_before),
        "probe leaves no threads running",
        f"new thread(s): {', '.join(sorted(t.name for t in _backend_threads() - threads_before))}",
    )
    report.check(first.available or bool(first.reason), "an unavailable probe says why", "empty reason")
    if not first.available:
        report.skipped.append(f"lifecycle checks: backend unavailable here ({first.reason})")
        return report

    _check_session(report, backend, workload, options, timeout_s, require_activities)
    _check_through_engine(report, backend, workload, options)
    return report


def _backend_threads() -> set[threading.Thread]:
    """Live threads other than polyprof's own guard thread (which runs the kit's calls)."""
    return {t for t in threading.enumerate() if t.name != GUARD_THREAD_NAME}


def _check_session(
    report: ConformanceReport,
    backend: Any,
    workload: Callable[[], Any] | None,
    options: Mapping[str, Any] | None,
    timeout_s: float,
    require_activities: bool,
) -> None:
    config = ProfileConfig(activities=frozenset(a.upper() for a in backend.activities))
    schema = getattr(backend, "options", None)
    if schema is not None and callable(getattr(schema, "check", None)):
        try:
            options = schema.check(backend.name, dict(options or {}))
        except Exception as exc:
            report.check(False, "its options schema accepts the options given", describe(exc))
            return
    ctx = SessionContext(backend.name, options)
    ok, session = _call(report, "create_session", backend.create_session, config, ctx, timeout_s=timeout_s)
    if not ok:
        return
    missing = [m for m in REQUIRED_SESSION_METHODS if not callable(getattr(session, m, None))]
    if not report.check(not missing, "session has prepare/start/stop/collect/close", f"missing {missing}"):
        return
    trait_problems = session_trait_problems(session)
    report.check(not trait_problems, "session declares its traits as a SessionTraits", "; ".join(trait_problems))
    push = getattr(session, "push_correlation", None)
    pop = getattr(session, "pop_correlation", None)
    report.check(callable(push) == callable(pop), "push_correlation and pop_correlation come as a pair")
    if not _call(report, "prepare", session.prepare, timeout_s=timeout_s)[0]:
        return
    ctx.window_start = w0 = host_ns()
    if not _call(report, "start", session.start, timeout_s=timeout_s)[0]:
        _call(report, "close after failed start", session.close, timeout_s=timeout_s)
        return
    pushed = _run_workload(report, workload, push, pop)
    flushed = _check_flush(report, session, backend.name, timeout_s)
    ctx.window_end = w1 = host_ns()
    _call(report, "stop", session.stop, timeout_s=timeout_s)
    _call(report, "stop (again)", session.stop, timeout_s=timeout_s)
    sink = Sink(backend.name)
    ok, _ = _call(report, "collect", session.collect, sink, timeout_s=timeout_s)
    collected_at = host_ns()
    _call(report, "close", session.close, timeout_s=timeout_s)
    _call(report, "close (again)", session.close, timeout_s=timeout_s)
    if not ok:
        return
    report.check(not ctx.report.errors, "reports no errors", "; ".join(ctx.report.errors))
    rejected = sink.rejected
    report.check(
        not rejected,
        "emits only valid rows (declared device/resource, end >= start, integer timestamps)",
        ", ".join(f"{k}: {v}" for k, v in rejected.items()),
    )
    collected = sink.seal(ctx.status).activities
    if flushed is not None:
        seen = {(int(k), int(a), int(b), int(c)) for k, a, b, c in zip(flushed["kind"], flushed["start"], flushed["end"], flushed["correlation"], strict=True)}
        again = sum(
            (int(k), int(a), int(b), int(c)) in seen
            for k, a, b, c in zip(collected["kind"], collected["start"], collected["end"], collected["correlation"], strict=True)
        )
        report.check(again == 0, "collect does not hand over again what flush handed over", f"{again} rows twice")
    acts = _joined(flushed, collected)
    report.activities = len(acts)
    if require_activities:
        report.check(len(acts) > 0, "records activities for the workload", "no rows collected")
    if not len(acts):
        return
    _check_rows(report, acts, ctx, (w0, w1), collected_at, pushed)


def _run_workload(report: ConformanceReport, workload: Callable[[], Any] | None, push: Any, pop: Any) -> set[int]:
    """The workload under a host id made current (and pushed to the session where it takes ids): the ids
    pushed, which device work's External ids may name."""
    pushed: set[int] = set()
    balanced = True
    try:
        if callable(push) and callable(pop):
            ident = correlation.new_id()
            pushed.add(ident)
            token = correlation.current.set(ident)
            try:
                push(ident, correlation.KIND_ANNOTATION)
                try:
                    if workload is not None:
                        workload()
                finally:
                    pop(correlation.KIND_ANNOTATION)
            finally:
                correlation.current.reset(token)
        elif workload is not None:
            ident = correlation.new_id()
            pushed.add(ident)
            token = correlation.current.set(ident)
            try:
                workload()
            finally:
                correlation.current.reset(token)
    except BaseException as exc:
        balanced = False
        report.check(False, "workload and correlation push/pop run cleanly", describe(exc))
    if balanced:
        report.passed.append("correlation push/pop balanced around the workload")
    return pushed


def _check_rows(report: ConformanceReport, acts: Any, ctx: SessionContext, window: tuple[int, int], collected_at: int,
                pushed: set[int]) -> None:
    """What every collected row must be: inside the window, flows paired, External ids known, kinds known."""
    w0, w1 = window
    slack = 1_000_000 + max(
        (c.get("residual_ns", 0) + c.get("uncertainty_ns", 0) for c in ctx.report.clock.values()), default=0
    )
    start, end = acts["start"], acts["end"]
    early = int(np.count_nonzero(start < w0 - slack))
    late = int(np.count_nonzero(start > w1 + slack))
    report.check(
        early == 0 and late == 0,
        "activities start inside the capture window (host clock)",
        f"{early} before, {late} after the window (slack {slack} ns)",
    )
    report.check(
        int(np.count_nonzero(end > collected_at + slack)) == 0, "no activity ends in the future of collect"
    )
    fid = acts["flow_id"]
    has = fid != 0
    if has.any():
        key = fid[has] * 4 + acts["flow_type"][has]
        starts = key[acts["flow_start"][has] == 1]
        ends = key[acts["flow_start"][has] == 0]
        unmatched = len(set(starts.tolist()) ^ set(ends.tolist()))
        report.check(unmatched == 0, "every flow has a start and an end", f"{unmatched} flows with one end")
    device_rows = np.isin(acts["kind"], [int(k) for k in DEVICE_KINDS])
    ext = acts["external_id"][device_rows]
    if len(ext) and pushed:
        stray = set(ext[ext != 0].tolist()) - pushed
        report.check(
            not stray,
            "device work's External ids are host ids that were pushed",
            f"unknown ids {sorted(stray)[:5]}",
        )
    kinds = set(acts["kind"].tolist())
    report.check(all(k in {int(x) for x in ActivityKind} for k in kinds), "uses only known activity kinds")


def _check_flush(report: ConformanceReport, session: Any, name: str, timeout_s: float) -> Any:
    """A session with flush(sink): called once while recording, its rows must be valid; returns them."""
    flush = getattr(session, "flush", None)
    if not callable(flush):
        report.skipped.append("flush (the session does not implement it)")
        return None
    sink = Sink(name)
    ok, _ = _call(report, "flush while recording", flush, sink, timeout_s=timeout_s)
    rejected = sink.rejected
    report.check(not rejected, "flush emits only valid rows", ", ".join(f"{k}: {v}" for k, v in rejected.items()))
    return sink.seal(SessionContext(name).status).activities if ok else None


def _joined(first: ActivityTable | None, second: ActivityTable) -> ActivityTable:
    """The rows of a flush and of the collect after it, as one table (for the row checks)."""
    if first is None or not len(first):
        return second
    ident = np.arange(1 << 16, dtype=np.int32)
    return ActivityTable.concat([(first, ident, ident, 0), (second, ident, ident, 0)])


def _check_through_engine(
    report: ConformanceReport,
    backend: Any,
    workload: Callable[[], Any] | None,
    options: Mapping[str, Any] | None,
) -> None:
    from polyprof.engine.registry import Registry
    from polyprof.engine.scheduled import Profile

    registry = Registry(use_entry_points=False, use_env=False)
    registry.register(backend)
    try:
        prof = Profile(
            sorted(backend.activities),
            registry=registry,
            backend_options={backend.name: dict(options or {})} if options else None,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # problems are reported as failures below instead
            with prof:
                if workload is not None:
                    workload()
        status = prof.trace.backends.get(backend.name)
        report.check(
            status is not None and status.state == BACKEND_RAN and not status.errors and not status.rejected,
            "runs cleanly through the engine",
            f"status {status.to_json() if status else None}",
        )
    except BaseException as exc:
        report.check(False, "runs cleanly through the engine", describe(exc))


def assert_conforms(backend: Any, **kwargs: Any) -> ConformanceReport:
    """check_backend, raising AssertionError with the full explanation when anything failed."""
    report = check_backend(backend, **kwargs)
    if not report.ok:
        raise AssertionError(report.explain())
    return report
