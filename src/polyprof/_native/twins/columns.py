"""Twins of _native/csrc/columns.c: strings coded by first appearance, the rows that hold a value, and the
walk over a buffer of kind-tagged records of known sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyprof._native.shared import np


def code_strings(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """``(codes, table)`` with ``table[codes[i]] == values[i]``: each distinct value once in `table`
    (first-seen order)."""
    ids: dict[Any, int] = {}
    codes = np.fromiter((ids.setdefault(v, len(ids)) for v in values), dtype=np.int64, count=len(values))
    return codes, list(ids)


def present_rows(values: Sequence[Any]) -> np.ndarray:
    """The positions (int64) of the entries of `values` that are not None."""
    return np.fromiter((i for i, v in enumerate(values) if v is not None), dtype=np.int64)


def walk_tagged_records(
    buffer: np.ndarray, start: int, valid: int, table: np.ndarray, kinds: np.ndarray, offsets: np.ndarray
) -> tuple[int, int]:
    """Records of known size from byte `start` (each begins with its uint32 kind; ``table[kind]`` its
    size, 0 unknown): how many were written to kinds/offsets, and where the walk stopped."""
    words = memoryview(buffer[: valid - valid % 4]).cast("I")
    count, offset, known = 0, start, len(table)
    while offset + 4 <= valid and count < len(kinds):
        kind = words[offset >> 2]
        size = int(table[kind]) if kind < known else 0
        if size <= 0:
            break
        kinds[count], offsets[count] = kind, offset
        count += 1
        offset += size
    return count, offset


def nesting_levels(
    order: np.ndarray, resource: np.ndarray, start: np.ndarray, end: np.ndarray, skip: np.ndarray, level: np.ndarray
) -> None:
    """Each row's nesting level on its resource into `level`: `order` is the rows by (resource, start,
    longest first); rows in `skip` are not counted. A row's level is the number of rows still open when
    it starts (a stack of ends, popped while its top has ended)."""
    stack: list[int] = []
    current = None
    for row in order.tolist():
        if skip[row]:
            continue
        if resource[row] != current:
            stack, current = [], resource[row]
        s = start[row]
        while stack and stack[-1] <= s:
            stack.pop()
        level[row] = len(stack)
        stack.append(end[row])
