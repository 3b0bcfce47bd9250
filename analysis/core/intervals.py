"""Interval arithmetic on numpy arrays: unions, gaps and the time spent in each overlap state.

Intervals are half-open [start, end) pairs of int64 arrays (nanoseconds in the analysis), so
sums are exact and the parts of a window add up to its length with no rounding. An interval
whose end is before its start is read as empty. Definitions built on these helpers are in
docs/definitions.md.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]


def _as_pair(starts, ends) -> Intervals:
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if starts.shape != ends.shape:
        raise ValueError(f"starts and ends differ in length ({starts.size} vs {ends.size})")
    return starts, np.maximum(ends, starts)


def union(starts, ends) -> Intervals:
    """The disjoint, sorted intervals covering the same time as the input (touching ones join)."""
    starts, ends = _as_pair(starts, ends)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # A new run begins where an interval starts after everything before it has ended.
    begins = np.empty(starts.size, dtype=bool)
    begins[0] = True
    begins[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(begins)
    last = np.append(first[1:], starts.size) - 1
    return starts[first], reach[last]


def total(starts, ends) -> int:
    """Length of the union of the intervals."""
    u_starts, u_ends = union(starts, ends)
    return int((u_ends - u_starts).sum())


def gaps(u_starts, u_ends, window_start: int, window_end: int) -> Intervals:
    """The parts of [window_start, window_end) that no interval covers, in order; the intervals
    given as a union (disjoint, sorted and apart, as union() returns them), so that a caller
    asking about many windows unites them once."""
    u_starts = np.clip(u_starts, window_start, window_end)
    u_ends = np.clip(u_ends, window_start, window_end)
    keep = u_ends > u_starts
    u_starts, u_ends = u_starts[keep], u_ends[keep]
    gap_starts = np.concatenate(([window_start], u_ends))
    gap_ends = np.concatenate((u_starts, [window_end]))
    keep = gap_ends > gap_starts
    return gap_starts[keep], gap_ends[keep]


def state_durations(layers: list[Intervals], window_starts, window_ends) -> np.ndarray:
    """Time each combination of layers is active, per window, by one sweep over all boundaries.

    `layers` holds k interval sets (each may overlap itself). The state at an instant is the
    bitmask of the layers active then (bit i for layers[i]). Returns an int64 array of shape
    (number of windows, 2**k): entry [w, s] is the time window w spends in state s. Each row sums
    to its window's length exactly.
    """
    k = len(layers)
    window_starts, window_ends = _as_pair(window_starts, window_ends)
    n_states = 1 << k
    if window_starts.size == 0:
        return np.zeros((0, n_states), dtype=np.int64)
    times, layer_of, delta = [], [], []
    for bit, (starts, ends) in enumerate(layers):
        starts, ends = _as_pair(starts, ends)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        times += [starts, ends]
        layer_of += [np.full(starts.size * 2, bit, dtype=np.int64)]
        delta += [np.ones(starts.size, dtype=np.int64), -np.ones(ends.size, dtype=np.int64)]
    times = np.concatenate(times) if times else np.zeros(0, dtype=np.int64)
    if times.size == 0:
        result = np.zeros((window_starts.size, n_states), dtype=np.int64)
        result[:, 0] = window_ends - window_starts
        return result
    layer_of = np.concatenate(layer_of)
    delta = np.concatenate(delta)
    order = np.argsort(times, kind="stable")
    times, layer_of, delta = times[order], layer_of[order], delta[order]

    # Active count of each layer after each boundary, then the state after the last boundary at
    # each distinct time (several intervals may start or end at the same instant).
    counts = np.zeros((k, times.size), dtype=np.int64)
    for bit in range(k):
        counts[bit] = np.cumsum(np.where(layer_of == bit, delta, 0))
    masks = np.zeros(times.size, dtype=np.int64)
    for bit in range(k):
        masks |= (counts[bit] > 0).astype(np.int64) << bit
    last_at_time = np.append(times[1:] != times[:-1], True)
    bounds = times[last_at_time]
    seg_mask = masks[last_at_time]

    # Sentinels: nothing is active before the first boundary or after the last one.
    lo = min(int(window_starts.min()), int(bounds[0]))
    hi = max(int(window_ends.max()), int(bounds[-1]))
    bounds = np.concatenate(([lo], bounds, [hi]))
    seg_mask = np.concatenate(([0], seg_mask, [0]))
    seg_len = np.diff(bounds)  # segment i runs from bounds[i] to bounds[i+1] in seg_mask[i]

    # cum[s, i]: time spent in state s before bounds[i].
    cum = np.zeros((n_states, bounds.size), dtype=np.int64)
    for state in range(n_states):
        cum[state, 1:] = np.cumsum(np.where(seg_mask[:-1] == state, seg_len, 0))

    def time_in_states_before(x: np.ndarray) -> np.ndarray:
        seg = np.clip(np.searchsorted(bounds, x, side="right") - 1, 0, bounds.size - 1)
        partial = x - bounds[seg]
        before = cum[:, seg].copy()
        before[seg_mask[seg], np.arange(x.size)] += partial
        return before

    result = time_in_states_before(window_ends) - time_in_states_before(window_starts)
    return result.T.copy()


def hta_merged(ts: np.ndarray, end: np.ndarray) -> tuple[float, float, float]:
    """(busy time, first start, last end) exactly as HTA 0.5.0's merge_kernel_intervals does it.

    HTA sorts by start, opens a new group where a start lies strictly after every earlier end,
    and sums (latest end - first start) per group. Unlike `union`, an interval whose end precedes
    its start is kept and counts negatively: HTA's rounding of nanosecond traces (ceil the start,
    floor the end) makes such intervals from sub-microsecond kernels, and matching HTA means
    keeping them. Raises ValueError on no intervals, where HTA fails too.
    """
    ts = np.asarray(ts, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    if ts.size == 0:
        raise ValueError("no intervals to merge")
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    reach_before = np.maximum.accumulate(end)[:-1]
    begins = np.empty(ts.size, dtype=bool)
    begins[0] = True
    begins[1:] = ts[1:] > reach_before
    first = np.flatnonzero(begins)
    group_start = ts[first]
    group_end = np.maximum.reduceat(end, first)
    busy = float(group_end.sum() - group_start.sum())
    return busy, float(group_start[0]), float(group_end[-1])
