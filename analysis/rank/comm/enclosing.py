"""The spans around a communication op (analysis.rank.comm.event_ops): the innermost enclosing span,
for each (thread, time) the latest-starting span on that thread that holds the time, which joins a
kernel (through its runtime launch) or a gloo op to the host call that issued it; and the
ProfilerStep that holds the time each op was issued at."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.frames import (
    category_matches,
    each_distinct,
    object_array,
    texts,
    values_at,
)
from analysis.core.steps import WHOLE_TRACE_STEP, step_at

# Queries innermost steps back through together before it walks the rest one by one.
_VECTOR_STEPS = 64


def thread_ids(pids, tids, query_pids, query_tids) -> tuple[np.ndarray, np.ndarray]:
    """Integer ids of the candidates' threads and of the queries': equal where the pid and the
    tid both print alike."""
    pid_codes = pd.factorize(np.concatenate([_printed(pids), _printed(query_pids)]))[0]
    tid_codes = pd.factorize(np.concatenate([_printed(tids), _printed(query_tids)]))[0]
    ids = pid_codes.astype(np.int64) * (int(tid_codes.max(initial=0)) + 1) + tid_codes
    return ids[:len(pids)], ids[len(pids):]


def _printed(values) -> np.ndarray:
    return each_distinct(object_array(list(values)), str)


def innermost(candidates: pd.DataFrame, pids, tids, times) -> np.ndarray:
    """Per query (pid, tid, time): the index label of the latest-starting candidate on that
    thread whose span holds the time (the first such in frame order on ties), else -1."""
    if candidates is None or candidates.empty:
        return np.full(len(times), -1, dtype=np.int64)
    thread, query_thread = thread_ids(candidates["pid"].to_numpy(), candidates["tid"].to_numpy(),
                                      pids, tids)
    return innermost_among(
        thread, candidates["ts_ns"].to_numpy(dtype="float64"),
        candidates["dur_ns"].to_numpy(dtype="float64"), candidates.index.to_numpy(),
        query_thread, times)


def innermost_among(thread, all_starts, all_durations, all_labels, query_thread,
                    times) -> np.ndarray:
    """innermost over candidates given as arrays: thread ids (thread_ids), starts, durations,
    labels; and queries as thread ids and times."""
    result = np.full(len(times), -1, dtype=np.int64)
    if not len(all_labels) or not len(times):
        return result
    query_ts = np.asarray(times, dtype="float64")
    for key in np.unique(thread):
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


# ---- the kernel's launch -------------------------------------------------------------------------
_LAUNCH_CATEGORIES = ("runtime", "driver")


def launch_rows(events, is_gpu, kernel_corr) -> tuple[np.ndarray, np.ndarray]:
    """(the events row of each kernel's runtime launch, given by its correlation id, whether it
    has one): the first runtime or driver event with that id."""
    # The category test on every event costs one lookup per event, and leaves few rows.
    on_host = ~np.asarray(is_gpu, dtype=bool) & category_matches(events["cat"], _LAUNCH_CATEGORIES)
    rows = np.flatnonzero(on_host)
    ids = (values_at(events["correlation"], rows, "float64") if "correlation" in events.columns
           else np.full(len(rows), np.nan))
    # Only the launches of these kernels matter.
    kernel_ids = np.unique(kernel_corr)
    kept = ids >= 0
    if len(kernel_ids):
        kept &= kernel_ids[np.minimum(np.searchsorted(kernel_ids, ids),
                                      len(kernel_ids) - 1)] == ids
    else:
        kept[:] = False
    rows, ids = rows[kept], ids[kept]
    # The first launch of each correlation id, sorted by id for the lookup below.
    launch_corr, first = np.unique(ids, return_index=True)
    rows = rows[first]
    if not len(launch_corr):
        # Any row: `found` masks it.
        return np.zeros(len(kernel_corr), dtype=np.int64), np.zeros(len(kernel_corr), bool)
    at = np.minimum(np.searchsorted(launch_corr, kernel_corr), len(launch_corr) - 1)
    return rows[at], launch_corr[at] == kernel_corr


def launches(events, is_gpu, kernel_corr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, pid, tid) of the runtime launch of each kernel, given by its correlation id
    (NaN/None where not found): the first runtime or driver event with that id."""
    return launch_values(events, *launch_rows(events, is_gpu, kernel_corr))


def launch_values(events, rows_of, found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, pid, tid) of the launches at `rows_of` (launch_rows), NaN/None where not found."""
    launch_ts = np.where(found, values_at(events["ts_ns"], rows_of, "float64"), np.nan)
    launch_pid = np.where(found, texts(events["pid"], rows_of), None)
    launch_tid = np.where(found, texts(events["tid"], rows_of), None)
    return launch_ts, launch_pid, launch_tid


def row_thread_ids(events, rows: np.ndarray) -> np.ndarray:
    """thread_ids of the events at `rows`, read from the categories of their pid and tid (an id
    per printed category)."""
    pid, tid = events["pid"], events["tid"]
    pid_ids, tid_ids = _printed_ids(pid), _printed_ids(tid)
    return (pid_ids[pid.cat.codes.to_numpy()[rows]].astype(np.int64)
            * (int(tid_ids.max(initial=0)) + 1) + tid_ids[tid.cat.codes.to_numpy()[rows]])


def _printed_ids(column: pd.Series) -> np.ndarray:
    """An id per category, equal where they print alike; the last for code -1 (texts prints
    a missing value as "nan")."""
    printed = [str(c) for c in column.cat.categories] + ["nan"]
    return pd.factorize(object_array(printed))[0]


# ---- the step around each op ---------------------------------------------------------------------
def sorted_positions(sort_ts: pd.Series, kept) -> np.ndarray:
    """The positions of the kept rows (all for None) ordered by their times (numbers), ties in
    row order and NaN last, as sort_values(kind="stable") orders them."""
    positions = np.flatnonzero(kept) if kept is not None else np.arange(len(sort_ts))
    return positions[np.argsort(sort_ts.to_numpy()[positions], kind="stable")]


def steps_kept(host_ts: pd.Series, steps, all_steps):
    """(step of each op, which ops stay: None for all)."""
    has_all = isinstance(all_steps, pd.DataFrame) and not all_steps.empty
    has_selected = isinstance(steps, pd.DataFrame) and not steps.empty
    if not (has_all or has_selected):
        # A trace without ProfilerStep is analysed as one window, which the breakdown numbers
        # -1 (analysis.core.steps.WHOLE_TRACE_STEP).
        return WHOLE_TRACE_STEP, None
    times_ns = host_ts.to_numpy(dtype="float64")
    values, inside = _step_numbers(times_ns, all_steps if has_all else steps)
    step = pd.Series(pd.arrays.IntegerArray(values, ~inside), index=range(len(times_ns)))
    if not (has_all and has_selected):
        return step, None
    # Ops issued in ProfilerSteps left out of the selection go; ops issued outside every step
    # (before the first, after the last) stay, with no step.
    return step, ~inside | np.isin(values, steps["step"].to_numpy())


def _step_numbers(times_ns: np.ndarray, steps) -> tuple[np.ndarray, np.ndarray]:
    """(the ProfilerStep whose [start, end) holds each time, whether it is inside one): the
    number is 0 outside every step."""
    values = np.zeros(len(times_ns), dtype="int64")
    inside = np.zeros(len(times_ns), dtype=bool)
    if (isinstance(steps, pd.DataFrame) and not steps.empty and len(times_ns)
            and all(c in steps.columns for c in ("step", "start_ns", "end_ns"))):
        numbers, starts, ends = _step_spans(steps)
        found = step_at(times_ns, starts, ends, numbers)
        inside = ~np.isnan(found)
        values[inside] = found[inside].astype("int64")
    return values, inside


def _step_spans(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(number, start, end) of the steps with all three known, by start: the order of
    steps.dropna().sort_values("start_ns"), as float64."""
    numbers, starts, ends = (steps[c].to_numpy("float64", na_value=np.nan)
                             for c in ("step", "start_ns", "end_ns"))
    known = ~(np.isnan(numbers) | np.isnan(starts) | np.isnan(ends))
    order = starts[known].argsort(kind="quicksort")  # sort_values' default
    return numbers[known][order], starts[known][order], ends[known][order]
