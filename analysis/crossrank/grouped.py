"""Rows sorted into groups of equal keys, on arrays: where each group starts, running maxima
within a group and the length of each group's union of intervals. pandas' groupby costs more
than these on the few thousand rows of a run's ops, and as much again on none."""

from __future__ import annotations

import numpy as np


def group_starts(*sorted_keys) -> np.ndarray:
    """Where a new group starts among rows sorted by their keys."""
    starts = np.zeros(len(sorted_keys[0]), dtype=bool)
    starts[:1] = True
    for key in sorted_keys:
        starts[1:] |= key[1:] != key[:-1]
    return starts


def cummax_by_group(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The running maximum of `values` within each group of consecutive rows (a group begins
    where `starts`), exact in int64: taken on each value's rank among the distinct values,
    offset by its group so that a group never sees an earlier group's values."""
    distinct, rank = np.unique(values, return_inverse=True)
    offset = (np.cumsum(starts) - 1) * len(distinct)
    return distinct[np.maximum.accumulate(rank + offset) - offset]


def union_lengths(group: np.ndarray, groups: int, starts, ends) -> np.ndarray:
    """Per group (0 to groups - 1; `group` numbers each interval's): the length of the union
    of its intervals [start, end), empty ones ignored; time covered by several intervals
    counts once. In int64: float64 steps by 256 ns at epoch times."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    kept = np.flatnonzero(ends > starts)
    kept = kept[np.lexsort((starts[kept], group[kept]))]
    group, starts, ends = group[kept], starts[kept], ends[kept]
    first = group_starts(group)
    covered_until = cummax_by_group(ends, first)
    # A new piece of the union starts at a group's first interval and where an interval begins
    # after all earlier ones of its group ended; it lasts until its last interval's cover.
    new_piece = first.copy()
    new_piece[1:] |= starts[1:] > covered_until[:-1]
    piece_start = np.flatnonzero(new_piece)
    piece_last = np.append(piece_start[1:], len(starts))[:len(piece_start)] - 1
    lengths = np.zeros(groups, dtype=np.int64)
    np.add.at(lengths, group[piece_start], covered_until[piece_last] - starts[piece_start])
    return lengths
