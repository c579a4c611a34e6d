"""Correlation ids: how device work is attributed to the host operation that launched it.

Host operations (annotations, framework ops) take an id from :func:`new_id`, make it the current
external id of their context (a ``ContextVar``, so it is right per thread and per asyncio task), and
push it to every profiling session that asked for correlation (:data:`targets`, filled by the
engine). A device backend that intercepts launches in Python reads :func:`current_external_id`; one
whose vendor library keeps its own stack (CUPTI, PTI) implements ``push_correlation``/``pop_correlation``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from polyprof import _native

#: Framework operators (CUPTI's CUSTOM0, PTI's CUSTOM_0).
KIND_OP = "op"
#: User annotations such as record_function (CUPTI's CUSTOM1, PTI's CUSTOM_1).
KIND_ANNOTATION = "annotation"

#: A new process-wide id (shared by annotations, ops and backends, so ids never collide).
new_id: Callable[[], int] = _native.next_id
current: ContextVar[int] = ContextVar("polyprof_external_id", default=0)


def new_ids(n: int) -> Any:
    """`n` new process-wide ids at once, as an int64 array."""
    return _native.new_ids(n)


def current_external_id() -> int:
    """Id of the innermost host annotation or op open in this thread/task, 0 if none. Spans opened in
    plain synchronous code leave :data:`current` alone (it costs a HAMT node per span), so read the id
    here (or, in C, through :func:`external_id_reader`), not from the variable."""
    return current.get()


def external_id_reader() -> int:
    """The address of a C function ``long long reader(void)`` giving :func:`current_external_id` to a
    caller holding the GIL (a C interceptor), or 0 where the extension is not built (read
    :data:`current` then: every span sets it)."""
    return _native.external_id_reader()


current_external_id = _native.current_external_id  # noqa: F811 - the same answer, from the recorder's spans


class CorrelationTarget:
    """A session's push/pop pair; `on_error` removes it after its first failure."""

    __slots__ = ("push", "pop", "on_error")

    def __init__(
        self, push: Callable, pop: Callable, on_error: Callable[[CorrelationTarget, BaseException], None]
    ):
        self.push = push
        self.pop = pop
        self.on_error = on_error


#: Sessions to fan out to. Replaced (never mutated in place) so a reader iterating it is never hurt.
targets: tuple[CorrelationTarget, ...] = ()

#: Told whether there are targets each time they change: hot paths that keep the answer as a flag.
targets_listeners: list[Callable[[bool], None]] = [_native.set_has_targets]


def set_targets(new_targets: tuple[CorrelationTarget, ...]) -> None:
    global targets
    targets = new_targets
    for listener in targets_listeners:
        listener(bool(new_targets))


def push(correlation_id: int, kind: str) -> None:
    for t in targets:
        try:
            t.push(correlation_id, kind)
        except BaseException as exc:  # a backend must not take the program down
            t.on_error(t, exc)


def pop(kind: str) -> None:
    for t in targets:
        try:
            t.pop(kind)
        except BaseException as exc:
            t.on_error(t, exc)
