"""The innermost enclosing span: for each (thread, time), the latest-starting span on that
thread that holds the time. Used to join a kernel or a gloo op to the host call that issued it
(analysis.comm_events)."""

from __future__ import annotations

import numpy as np
import pandas as pd

# Queries innermost steps back through together before it walks the rest one by one.
_VECTOR_STEPS = 64


def thread_keys(pids, tids) -> np.ndarray:
    return np.array([f"{p}\0{t}" for p, t in zip(pids, tids)], dtype=object)


def innermost(candidates: pd.DataFrame, pids, tids, times) -> np.ndarray:
    """Per query (pid, tid, time): the index label of the latest-starting candidate on that
    thread whose span holds the time (the first such in frame order on ties), else -1."""
    if candidates is None or candidates.empty:
        return np.full(len(times), -1, dtype=np.int64)
    return innermost_among(
        thread_keys(candidates["pid"].to_numpy(), candidates["tid"].to_numpy()),
        candidates["ts_ns"].to_numpy(dtype="float64"),
        candidates["dur_ns"].to_numpy(dtype="float64"), candidates.index.to_numpy(), pids, tids,
        times)


def innermost_among(thread, all_starts, all_durations, all_labels, pids, tids,
                     times) -> np.ndarray:
    """innermost over candidates given as arrays: thread keys, starts, durations, labels."""
    result = np.full(len(times), -1, dtype=np.int64)
    if not len(all_labels) or not len(times):
        return result
    query_thread = thread_keys(pids, tids)
    query_ts = np.asarray(times, dtype="float64")
    for key in pd.unique(thread):
        where = np.flatnonzero(query_thread == key)
        if not len(where):
            continue
        mine = np.flatnonzero(thread == key)
        starts = all_starts[mine]
        order = np.lexsort((-np.arange(len(starts)), starts))
        starts = starts[order]
        ends = starts + all_durations[mine][order]
        labels = all_labels[mine][order]
        positions = np.searchsorted(starts, query_ts[where], side="right") - 1
        result[where] = _innermost_on_thread(starts, ends, labels, positions, query_ts[where])
    return result


def _innermost_on_thread(starts, ends, labels, positions, times) -> np.ndarray:
    """Walks back from each query's last candidate starting at or before its time to the first
    whose span holds it, every query one step at a time together; the few still walking after
    _VECTOR_STEPS steps (deeply overlapping spans) finish one by one."""
    found = np.full(len(times), -1, dtype=np.int64)
    # No candidate at or before j holds t once the latest end among them is before t.
    latest_end = np.maximum.accumulate(ends)
    walking = np.flatnonzero(positions >= 0)
    j = positions[walking]
    for _ in range(_VECTOR_STEPS):
        if not len(walking):
            return found
        t = times[walking]
        going = latest_end[j] >= t
        holds = going & (ends[j] >= t)
        found[walking[holds]] = labels[j[holds]]
        keep = going & ~holds & (j > 0)
        walking, j = walking[keep], j[keep] - 1
    for q, at in zip(walking, j):
        t = times[q]
        while at >= 0 and latest_end[at] >= t:
            if ends[at] >= t:
                found[q] = labels[at]
                break
            at -= 1
    return found
