"""HTA 0.5.0's get_temporal_breakdown, reproduced: the HTA-compatible columns.

HTA's own definitions, quirks included, so that our numbers can be checked against HTA's on the
same trace (docs/definitions.md, "HTA-compatible columns"); they are not ours.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.event_kinds import (
    HTA_COMM_RE,
    HTA_DEVICE_SYNC_NAMES,
    HTA_MEMORY_RE,
    HTA_NON_COMPUTE_RE,
)
from analysis.core.events import distinct_names, matches
from analysis.core.model import RankTrace, known_rank

HTA_COLUMNS = ["rank", "idle_us", "compute_us", "non_compute_us", "kernel_time_us", "note"]


def hta_is_compute(name: str) -> bool:
    """Whether HTA counts a kernel of this name as compute: its patterns, run only on names
    holding what one of them needs (most kernels' long template names hold none)."""
    if not ("Sync" in name or "Memcpy" in name or name.startswith(("nccl", "Memset", "dma"))):
        return True
    return _compute_by_patterns(name)


def _compute_by_patterns(name: str) -> bool:
    """HTA's rule itself: none of its communication, memory and non-compute patterns match."""
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
    Ranks where HTA finds no kernel (it raises there) get NaN and a note. Each rank brings its
    `hta_rank_summary` (its reduction's).
    """
    summaries = [trace.table("hta") for trace in traces]
    step_names = set().union(*(s["step_names"] for s in summaries))
    filtering = len(step_names) >= 2
    # HTA shifts every rank by the run's earliest start before summing; summing raw epoch
    # microseconds (~1e15 each) in float64 would lose whole microseconds.
    origin = min((s["origin"] for s in summaries if s["origin"] is not None), default=0)
    rows = []
    for summary in summaries:
        if summary["exact"] or summary["origin"] == origin:
            rows.append(summary["rows"][filtering])
        else:
            rows.append(_row_from_origin(summary, origin, filtering))
    return pd.DataFrame(rows, columns=HTA_COLUMNS)


def hta_rank_summary(trace: RankTrace) -> dict:
    """What hta_temporal_breakdown needs of one rank: its ProfilerStep names, its earliest start
    (the run's origin is the earliest of all), and its row with and without HTA's step window,
    shifted by its own earliest start. `exact`: every time is whole microseconds, so that the
    rows do not depend on the origin (float64 sums of integers); otherwise `kernels` holds what
    the rows are computed again from with the run's origin (_row_from_origin): the start and
    duration of each event with a stream, in order of start, and which of them each row sums."""
    step_names = {c for c in distinct_names(trace.events["name"]) if "ProfilerStep" in c}
    ts_us, dur_us, kept = _hta_times(trace)
    origin = int(ts_us[kept].min()) if kept.any() else None
    exact = bool(trace.float_timestamps
                 or (trace.events["dur_ns"].to_numpy(np.int64)[kept] % 1000 == 0).all())
    names = _NameMasks(trace.events["name"], step_names)
    ts = (ts_us - (origin or 0)).astype(np.float64)
    selected = {filtering: _hta_kernels(trace, ts, kept, names, filtering)
                for filtering in (False, True)}
    rows = {filtering: _hta_row(trace, ts, ts + dur_us, found, names)
            for filtering, found in selected.items()}
    summary = {"step_names": step_names, "origin": origin, "exact": exact, "rows": rows}
    if not exact:
        order = names.by_start(ts, trace.events["stream"].to_numpy() != -1)
        summary["kernels"] = {
            "ts_us": ts_us[order], "dur_us": dur_us[order],
            "sums": {filtering: found if isinstance(found, str)
                     else (found[0][order], found[1][order])
                     for filtering, found in selected.items()}}
    return summary


def _row_from_origin(summary: dict, origin: int, filtering: bool) -> dict:
    """The rank's row (`filtering` HTA's step window or not) with its times shifted by the
    run's `origin`, from its summary's `kernels`: what _hta_rank_of gives on its events."""
    row = dict(summary["rows"][filtering])
    kernels = summary["kernels"]
    sums = kernels["sums"][filtering]
    if isinstance(sums, str):  # no kernel HTA keeps: the note, whatever the origin
        return row
    ts = (kernels["ts_us"] - origin).astype(np.float64)
    end = ts + kernels["dur_us"]
    return _with_times(row, ts, end, *sums, np.arange(len(ts)))


class _NameMasks:
    """Which events' names are device syncs, ProfilerSteps, compute kernels: each computed once
    per rank, on first use, for both of its rows; and the order of its events by start, which
    its rows (computed with the same times) share."""

    def __init__(self, names: pd.Series, step_names: set[str]):
        self.names, self.step_names, self.found = names, step_names, {}
        self.order = None

    def by_start(self, ts: np.ndarray, among: np.ndarray) -> np.ndarray:
        """The positions of `among` (the same on every call) in stable order of ts."""
        if self.order is None:
            positions = np.flatnonzero(among)
            self.order = positions[np.argsort(ts[positions], kind="stable")]
        return self.order

    def get(self, kind: str, among: np.ndarray) -> np.ndarray:
        """The mask `kind`; exact on the rows of `among` (compute: where it is first asked)."""
        if kind not in self.found:
            if kind == "device_sync":
                self.found[kind] = matches(self.names, lambda n: n in HTA_DEVICE_SYNC_NAMES)
            elif kind == "step":
                self.found[kind] = matches(self.names, lambda n: n in self.step_names)
            else:
                self.found[kind] = among & matches(self.names, hta_is_compute, among=among)
        return self.found[kind]


def _hta_rank_of(trace: RankTrace, origin: int, step_names: set[str], filtering: bool) -> dict:
    """The rank's row with its times shifted by `origin`."""
    ts_us, dur_us, kept = _hta_times(trace)
    ts = (ts_us - origin).astype(np.float64)
    names = _NameMasks(trace.events["name"], step_names)
    return _hta_rank(trace, ts, ts + dur_us, kept, names, filtering)


def _launched_by(correlation: np.ndarray, host: np.ndarray, device: np.ndarray) -> np.ndarray:
    """np.isin(correlation, correlation[host]): through a table indexed by id where the ids are
    integers of a compact range (Kineto's are), as the sort behind np.isin costs more."""
    if correlation.dtype.kind not in "iu" or not host.any() or not device.any():
        return np.isin(correlation, np.unique(correlation[host]))
    low = int(correlation.min())
    size = int(correlation.max()) - low + 1
    if size > 4 * len(correlation) + 1024:
        return np.isin(correlation, np.unique(correlation[host]))
    launched = np.zeros(size, dtype=bool)
    launched[correlation[host] - low] = True
    return launched[correlation - low]


def _merged(ts: np.ndarray, end: np.ndarray, rows: np.ndarray, by_start: np.ndarray):
    """intervals.hta_merged of the rows, given in their stable order by start (`by_start`, a
    superset in that order): its own stable sort then finds them sorted, which costs little."""
    ordered = by_start[rows[by_start]]
    return intervals.hta_merged(ts[ordered], end[ordered])


def _hta_rank(trace: RankTrace, ts: np.ndarray, end: np.ndarray, kept: np.ndarray,
              names: _NameMasks, filtering: bool) -> dict:
    return _hta_row(trace, ts, end, _hta_kernels(trace, ts, kept, names, filtering), names)


def _hta_kernels(trace: RankTrace, ts: np.ndarray, kept: np.ndarray, names: _NameMasks,
                 filtering: bool) -> tuple[np.ndarray, np.ndarray] | str:
    """(the kernels HTA sums, the compute ones among them), masks of the events; or the note
    saying why HTA keeps no kernel. Comparisons of starts only: `ts` may be shifted by any
    whole number of microseconds."""
    events = trace.events
    stream = events["stream"].to_numpy()
    correlation = events["correlation"].to_numpy()
    on_device = kept & (((stream >= 0) & (correlation >= 0))
                        | names.get("device_sync", kept))
    on_host = kept & ~on_device
    if filtering:
        is_step = on_host & names.get("step", on_host)
        if not is_step.any():
            return "no ProfilerStep on this rank: HTA keeps no kernel here (and fails)"
        last_start = ts[is_step].max()
        host_kept = on_host & (ts < last_start)
        device_kept = on_device & _launched_by(correlation, host_kept, on_device)
        kept = host_kept | device_kept
    kernels = kept & (stream != -1)
    if not kernels.any():
        return "no GPU kernels: HTA's temporal breakdown fails on such traces"
    # Evaluated on every event with a stream: exact for the kernels of either row.
    return kernels, kernels & names.get("compute", stream != -1)


def _hta_row(trace: RankTrace, ts: np.ndarray, end: np.ndarray,
             found: tuple[np.ndarray, np.ndarray] | str, names: _NameMasks) -> dict:
    """The rank's row of HTA's columns for _hta_kernels' result `found`."""
    row = {"rank": known_rank(trace), "idle_us": np.nan, "compute_us": np.nan,
           "non_compute_us": np.nan, "kernel_time_us": np.nan, "note": ""}
    if isinstance(found, str):
        row["note"] = found
        return row
    by_start = names.by_start(ts, trace.events["stream"].to_numpy() != -1)
    return _with_times(row, ts, end, *found, by_start)


def _with_times(row: dict, ts: np.ndarray, end: np.ndarray, kernels: np.ndarray,
                compute: np.ndarray, by_start: np.ndarray) -> dict:
    """`row` with HTA's sums over the `kernels` and `compute` masks (`by_start`: the positions
    of every event with a stream in stable order of start)."""
    busy, first, last = _merged(ts, end, kernels, by_start)
    compute_busy = _merged(ts, end, compute, by_start)[0] if compute.any() else 0.0
    kernel_time = last - first
    idle = kernel_time - busy
    row.update(idle_us=idle, compute_us=compute_busy,
               non_compute_us=kernel_time - compute_busy - idle, kernel_time_us=kernel_time)
    return row
