"""Launch attribution: which host operation each runtime/driver call (and the device work its ac2g flow
leads to) belongs to, written as its External id.

The backend's id is authoritative: it comes from the context of the launching thread or asyncio task
(``ctx.current_external_id()``, or the vendor's external correlation fed by push/pop), which is right
even when tasks interleave on one thread. A launch without one takes the id its device row carries (the
end of its ac2g flow), where the backend put it there only. Containment only

- **fills** a launch that has no id: the innermost host op or annotation open on its thread when it
  started (how torch's aten ops, which cannot push ids, become the External id of their kernels);
- **refines** a launch to the innermost *synchronous* span open on its thread when that span started
  after the one the backend named: a framework op (``CPU_OP``, e.g. torch's aten ops) runs on the
  thread's stack, so if it is open at the launch, it launched. Annotations of backends whose spans follow
  the context (``context_scoped_spans``: polyprof's ``record_function``, which asyncio tasks may
  interleave on one thread) are never used to refine; other backends' annotations (torch's own
  ``record_function`` ranges) are.

Device rows follow their launch: the ac2g end of a changed launch gets the same id, unless the backend
gave it one of its own that the launch did not carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyprof import _native
from polyprof.merge.containment import innermost_open_span
from polyprof.merge.lookup import lookup
from polyprof.model import FLOW_AC2G, ActivityKind

CPU_OP, ANNOTATION = int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION)
LAUNCHES = (int(ActivityKind.RUNTIME), int(ActivityKind.DRIVER))


def in_order(order: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The rows where `mask` holds, in trace order."""
    rows = _native.ordered_rows(order, mask)
    return order[mask[order]] if rows is None else rows


@dataclass
class Launches:
    """Every launch (in trace order) and the innermost container open at it (-1: none), for the
    device-side annotation pass to reuse."""

    rows: np.ndarray
    innermost: np.ndarray


def attribute_launches(
    columns: dict[str, np.ndarray], order: np.ndarray, thread: np.ndarray, context_scoped: np.ndarray
) -> Launches:
    """Update ``columns["external_id"]`` in place (see the module docstring). `order` is the trace
    order, `thread` a per-row thread code, `context_scoped` a per-row mask of rows whose spans follow
    the context (never used to refine)."""
    kind, corr, ext = columns["kind"], columns["correlation"], columns["external_id"]
    launches = in_order(order, (kind == LAUNCHES[0]) | (kind == LAUNCHES[1]))
    none = Launches(launches, np.full(len(launches), -1, dtype=np.int64))
    if not len(launches):
        return none
    is_container = ((kind == CPU_OP) | (kind == ANNOTATION)) & (corr != 0)
    if not is_container.any():
        return none
    start, end = columns["start"], columns["end"]
    containers = in_order(order, is_container)
    inner = innermost_open_span(start, end, thread, containers, launches)
    given = _with_device_ids(columns, launches)
    new_ext = given.copy()
    fill = (given == 0) & (inner >= 0)
    new_ext[fill] = corr[inner[fill]]
    named = np.flatnonzero(given != 0)
    if len(named):
        refines = is_container & ((kind == CPU_OP) | ~context_scoped)
        if refines[containers].all():
            refiner = inner[named]  # every container may refine: the innermost one is the answer
        else:
            refiner = innermost_open_span(start, end, thread, in_order(order, refines), launches[named])
        has = refiner >= 0
        if has.any():
            at, span = named[has], refiner[has]
            later = start[span] >= _start_of_id(corr, start, containers, given[at])  # -1: not in the trace
            new_ext[at[later]] = corr[span[later]]
    changed = new_ext != ext[launches]
    if changed.any():
        rows, ids = launches[changed], new_ext[changed]
        _follow_flows(columns, rows, ids)  # (reads the launches' ids before they change)
        ext[rows] = ids
    return Launches(launches, inner)


def _device_ends(columns: dict[str, np.ndarray]) -> np.ndarray:
    """The rows at the end of an ac2g flow (device work)."""
    flow = columns["flow_id"]
    return np.flatnonzero((flow != 0) & (columns["flow_start"] == 0) & (columns["flow_type"] == FLOW_AC2G))


def _flow_targets(columns: dict[str, np.ndarray], launches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the launches with an ac2g flow, the device row at its end, -1 where none), in `launches`' order."""
    targets = _device_ends(columns)
    at = lookup(columns["flow_id"][targets], targets, columns["flow_id"][launches])
    return at >= 0, at


def _with_device_ids(columns: dict[str, np.ndarray], launches: np.ndarray) -> np.ndarray:
    """Each launch's id: its own, else the one the backend put on its device row only."""
    ext = columns["external_id"]
    given = ext[launches].copy()
    has, target = _flow_targets(columns, launches)
    take = has & (given == 0)
    if take.any():
        given[take] = ext[target[take]]
    return given


def _start_of_id(corr: np.ndarray, start: np.ndarray, containers: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The start of the container whose correlation is each id (-1 where no container has it)."""
    return lookup(corr[containers], start[containers], ids)


def _follow_flows(columns: dict[str, np.ndarray], launches: np.ndarray, ids: np.ndarray) -> None:
    """Give the device rows at the end of each launch's ac2g flow the launch's new id, where a row had no
    id or the launch's own (one the backend gave the device row alone stands). Call before the launches'
    ids change."""
    flow, ext = columns["flow_id"], columns["external_id"]
    launch_flow = flow[launches]
    with_flow = launch_flow != 0
    if not with_flow.any():
        return
    keys, new, old = launch_flow[with_flow], ids[with_flow], ext[launches[with_flow]]
    targets = _device_ends(columns)
    at = lookup(keys, np.arange(len(keys)), flow[targets])
    hit = at >= 0
    rows, k = targets[hit], at[hit]
    follow = (ext[rows] == 0) | (ext[rows] == old[k])
    ext[rows[follow]] = new[k][follow]
