"""Finding rows by an id (a flow id, a correlation id) for many ids at once: the join every merge pass
needs, done once here.

    lookup(keys=np.array([7, 3, 9]), values=np.array([0, 1, 2]), queries=np.array([3, 4]))
    # -> array([ 1, -1])

Ids are usually dense (correlation ids count up from a process-wide counter), so where the ids span at
most a few times as many values as there are keys, a table indexed by id answers each query with one
load; otherwise, or when a key repeats, the keys are sorted and searched.
"""

from __future__ import annotations

import numpy as np

#: a dense table is used while the ids span at most this many slots per key (and a little slack)
DENSE_SLOTS_PER_KEY = 4


def lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray, missing: int = -1) -> np.ndarray:
    """For each query, the value of the first key equal to it (in `keys`' order), else `missing`."""
    out_dtype = np.result_type(values.dtype, np.min_scalar_type(missing))
    if not len(keys) or not len(queries):
        return np.full(len(queries), missing, dtype=out_dtype)
    low, high = int(keys.min()), int(keys.max())
    span = high - low + 1
    if span <= DENSE_SLOTS_PER_KEY * len(keys) + 1024:
        slots = keys - low
        if int(np.bincount(slots, minlength=span).max()) == 1:  # unique keys: one slot each
            table = np.full(span, missing, dtype=out_dtype)
            table[slots] = values
            inside = (queries >= low) & (queries <= high)
            if inside.all():
                return table[queries - low]
            found = np.full(len(queries), missing, dtype=out_dtype)
            found[inside] = table[queries[inside] - low]
            return found
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    pos = np.minimum(np.searchsorted(sorted_keys, queries), len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == queries, values[by_key[pos]], missing).astype(out_dtype, copy=False)
