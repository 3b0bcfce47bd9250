"""HTA 0.5.0's get_temporal_breakdown, reproduced: the HTA-compatible columns.

HTA's own definitions, quirks included, so that our numbers can be checked against HTA's on the
same trace (docs/definitions.md, "HTA-compatible columns"); they are not ours.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import intervals
from analysis.events import (
    HTA_COMM_RE,
    HTA_DEVICE_SYNC_NAMES,
    HTA_MEMORY_RE,
    HTA_NON_COMPUTE_RE,
    distinct_names,
    matches,
)
from analysis.load import RankTrace

HTA_COLUMNS = ["rank", "idle_us", "compute_us", "non_compute_us", "kernel_time_us", "note"]


def hta_is_compute(name: str) -> bool:
    return not (HTA_COMM_RE.match(name) or HTA_MEMORY_RE.match(name)
                or HTA_NON_COMPUTE_RE.match(name))


def _hta_times(trace: RankTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start in whole microseconds, HTA's duration in microseconds, events HTA keeps).

    HTA reads float timestamps as float64 and takes ceil(ts) and floor(ts + dur) at the file's
    own magnitude (~1e15 us, where float64 steps by 0.25 us); integer timestamps it keeps, with
    end = ts + dur. The float a file held is rebuilt exactly from our nanoseconds (whole
    microseconds plus a fraction float64 holds exactly). HTA drops events without a category
    and the profiler's own span (category Trace).
    """
    kept = matches(trace.events["cat"], lambda c: c not in ("", "trace"))
    ts_ns = trace.events["ts_ns"].to_numpy(np.int64)
    dur_ns = trace.events["dur_ns"].to_numpy(np.int64)
    whole_us = ts_ns // 1000
    if trace.float_timestamps:
        ts_us = whole_us.astype(np.float64) + (ts_ns % 1000) / 1000.0
        start = np.ceil(ts_us)
        return start.astype(np.int64), np.floor(ts_us + dur_ns / 1000.0) - start, kept
    return whole_us, dur_ns / 1000.0, kept


def hta_temporal_breakdown(traces: list[RankTrace]) -> pd.DataFrame:
    """HTA 0.5.0's get_temporal_breakdown for the traces of one run (one row per rank).

    HTA's window: when the run's traces name two or more distinct ProfilerStep#N, each rank keeps
    the host events that start before its last ProfilerStep does, and the device events launched
    by them (joined on correlation); otherwise everything. Kernels are the events with a stream.
    kernel_time is from the first kernel's start to the last kernel's end; idle is kernel_time
    minus the time any kernel runs; compute is the time compute kernels run; non_compute the rest.
    Ranks where HTA finds no kernel (it raises there) get NaN and a note.
    """
    step_names: set[str] = set()
    for trace in traces:
        step_names.update(c for c in distinct_names(trace.events["name"]) if "ProfilerStep" in c)
    filtering = len(step_names) >= 2
    times = [_hta_times(trace) for trace in traces]
    # HTA shifts every rank by the run's earliest start before summing; summing raw epoch
    # microseconds (~1e15 each) in float64 would lose whole microseconds.
    origin = min((int(ts[kept].min()) for ts, _, kept in times if kept.any()), default=0)
    rows = []
    for trace, (ts_us, dur_us, kept) in zip(traces, times):
        ts = (ts_us - origin).astype(np.float64)
        rows.append(_hta_rank(trace, ts, ts + dur_us, kept, step_names, filtering))
    return pd.DataFrame(rows, columns=HTA_COLUMNS)


def _hta_rank(trace: RankTrace, ts: np.ndarray, end: np.ndarray, kept: np.ndarray,
              step_names: set[str], filtering: bool) -> dict:
    row = {"rank": trace.rank, "idle_us": np.nan, "compute_us": np.nan,
           "non_compute_us": np.nan, "kernel_time_us": np.nan, "note": ""}
    events = trace.events
    names = events["name"]
    stream = events["stream"].to_numpy()
    correlation = events["correlation"].to_numpy()
    on_device = kept & (((stream >= 0) & (correlation >= 0))
                        | matches(names, lambda n: n in HTA_DEVICE_SYNC_NAMES))
    on_host = kept & ~on_device
    if filtering:
        is_step = on_host & matches(names, lambda n: n in step_names)
        if not is_step.any():
            row["note"] = "no ProfilerStep on this rank: HTA keeps no kernel here (and fails)"
            return row
        last_start = ts[is_step].max()
        host_kept = on_host & (ts < last_start)
        device_kept = on_device & np.isin(correlation, np.unique(correlation[host_kept]))
        kept = host_kept | device_kept
    kernels = kept & (stream != -1)
    if not kernels.any():
        row["note"] = "no GPU kernels: HTA's temporal breakdown fails on such traces"
        return row
    busy, first, last = intervals.hta_merged(ts[kernels], end[kernels])
    compute = kernels & matches(names, hta_is_compute)
    compute_busy = intervals.hta_merged(ts[compute], end[compute])[0] if compute.any() else 0.0
    kernel_time = last - first
    idle = kernel_time - busy
    row.update(idle_us=idle, compute_us=compute_busy,
               non_compute_us=kernel_time - compute_busy - idle, kernel_time_us=kernel_time)
    return row
