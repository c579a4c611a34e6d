"""Forward->backward links and the sequence args torch writes, rebuilt from what either recorder saw."""

from __future__ import annotations

import itertools

import numpy as np

from polyprof.plugin.backend import SessionContext

EVALUATE_FUNCTION = "autograd::engine::evaluate_function: "


def sequence_args(
    rows: np.ndarray, seq: np.ndarray, fwd_tid: np.ndarray, source: np.ndarray | None = None
) -> dict[int, dict]:
    """``Sequence number``/``Fwd thread id`` as torch writes them, for `rows`, taken from the rows
    `source` (default: the rows themselves)."""
    source = rows if source is None else source
    return {
        i: {"Sequence number": s, "Fwd thread id": f}
        for i, s, f in zip(rows.tolist(), seq[source].tolist(), fwd_tid[source].tolist(), strict=True)
    }


def evaluate_function_args(
    name_codes: np.ndarray, names: list[str], seq: np.ndarray, fwd_tid: np.ndarray, tid: np.ndarray
) -> dict[int, dict]:
    """torch gives autograd's ``evaluate_function`` ranges the ``Sequence number``/``Fwd thread id`` of
    the backward node they run: their first child on the same thread."""
    evaluate = [code for code, name in enumerate(names) if name.startswith(EVALUATE_FUNCTION)]
    if not evaluate:
        return {}
    rows = np.flatnonzero(np.isin(name_codes[:-1], evaluate) & (seq[:-1] < 0))
    children = rows + 1
    linked = (seq[children] >= 0) & (fwd_tid[children] > 0) & (tid[children] == tid[rows])
    return sequence_args(rows[linked], seq, fwd_tid, children[linked])


#: forward ops kept waiting for a backward node in a later hand-over, at most (the oldest go first),
#: and for at most this long after they started (a backward node comes within its step; with top-level
#: operators only, most never come: the node op is inside its evaluate_function range)
CARRY_LIMIT = 1_000_000
CARRY_MAX_AGE_S = 300.0


def fwdbwd_flows(
    seq: np.ndarray,
    fwd_tid: np.ndarray,
    rf_tid: np.ndarray,
    start: np.ndarray,
    ctx: SessionContext,
    carry: dict[tuple[int, int], tuple[int, int]] | None = None,
    carry_max_age_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward->backward flows, as torch links them: a backward node (forward thread id > 0) to the
    latest-starting forward op with the same sequence number on that forward thread. Returns (flow id,
    flow start) columns.

    With `carry` (rows handed over in batches while recording), forward ops without their backward node
    in this batch get a flow id now and wait in `carry` (key -> flow id, start) for a later batch's
    backward node, for up to `carry_max_age_s` (default CARRY_MAX_AGE_S); the merge clears the flows of
    those whose partner never comes."""
    n = len(seq)
    flow_id = np.zeros(n, dtype=np.int64)
    flow_start = np.zeros(n, dtype=np.int8)
    has_seq = np.flatnonzero(seq >= 0)
    if len(has_seq) == 0:
        return flow_id, flow_start
    order = has_seq[np.argsort(start[has_seq], kind="stable")].tolist()
    forward: dict[tuple[int, int], int] = {}
    backward: dict[tuple[int, int], int] = {}
    seq_l, fwd_l, rf_l = seq.tolist(), fwd_tid.tolist(), rf_tid.tolist()
    for i in order:
        if fwd_l[i] == 0:
            forward[(rf_l[i], seq_l[i])] = i  # the latest start wins
        else:
            backward.setdefault((fwd_l[i], seq_l[i]), i)  # the earliest backward node
    pairs = [(forward[k], b) for k, b in backward.items() if k in forward]
    if pairs:
        ids = ctx.new_correlation_ids(len(pairs))
        fwd_rows = np.array([f for f, _ in pairs], dtype=np.int64)
        bwd_rows = np.array([b for _, b in pairs], dtype=np.int64)
        flow_id[fwd_rows] = ids
        flow_id[bwd_rows] = ids
        flow_start[fwd_rows] = 1
    if carry is not None:
        for key, row in backward.items():
            if key not in forward and key in carry:
                flow_id[row] = carry.pop(key)[0]
        waiting = [(key, row) for key, row in forward.items() if key not in backward]
        if waiting:
            ids = ctx.new_correlation_ids(len(waiting)).tolist()
            start_l = start.tolist()
            for (key, row), flow in zip(waiting, ids, strict=True):
                flow_id[row], flow_start[row] = flow, 1
                carry.pop(key, None)  # re-inserted last: the newest forward op is the one a node pairs with
                carry[key] = (flow, start_l[row])
            _forget_old(carry, int(start.max()) - int(1e9 * (carry_max_age_s or CARRY_MAX_AGE_S)))
    return flow_id, flow_start


def _forget_old(carry: dict[tuple[int, int], tuple[int, int]], before_ns: int) -> None:
    """The forward ops waiting since before `before_ns`, and the oldest past CARRY_LIMIT, let go (the
    carry is in the order they were put in, near enough their starts' order)."""
    gone = max(0, len(carry) - CARRY_LIMIT)
    for _, started in itertools.islice(carry.values(), gone, None):
        if started >= before_ns:
            break
        gone += 1
    for key in list(itertools.islice(carry, gone)):
        del carry[key]
