"""Idle gaps: the stretches of a step with no device activity (CPU traces: neither compute nor
communication), and what the host was doing meanwhile (docs/definitions.md, "Idle gaps")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.event_kinds import (
    CPU_OP_CAT,
    DATA_LOADING_RE,
    HOST_OP_CATS,
    PYTHON_CAT,
    RUNTIME_CATS,
    SYNC_RE,
)
from analysis.core.events import cat_is, matches
from analysis.core.model import RankTrace, known_rank
from analysis.rank.layers import (
    on_threads,
    pair,
    threads_of,
    trace_kind,
    trace_layers,
    window_bounds,
)

IDLE_GAP_COLUMNS = ["rank", "step", "start_ns", "end_ns", "dur_ns", "host_activity"]
WAITING_FOR_PEERS = "waiting_for_peers"
# Labels a wait for peers overrides: the host was blocked, or doing nothing that explains the gap.
# data_loading stays: a rank loading data while its collective waits is idle for its loading.
PEER_WAIT_OVERRIDES = ("other", "launch_bound", "synchronisation")


def _covered_before(starts: np.ndarray, ends: np.ndarray):
    """x -> time the disjoint, sorted intervals cover before x (vectorised over x)."""
    cum = np.concatenate(([0], np.cumsum(ends - starts)))

    def covered(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, x, side="right")  # intervals starting at or before x
        last = np.maximum(i - 1, 0)
        partial = np.clip(np.minimum(x, ends[last]) - starts[last], 0, None)
        return cum[last] + np.where(i > 0, partial, 0)

    return covered


def _overlap_with(gap_starts, gap_ends, busy: intervals.Intervals) -> np.ndarray:
    u_starts, u_ends = intervals.union(*busy)
    if u_starts.size == 0:
        return np.zeros(gap_starts.size, dtype=np.int64)
    covered = _covered_before(u_starts, u_ends)
    return covered(gap_ends) - covered(gap_starts)


def idle_gaps(trace: RankTrace, kind_layers: tuple | None = None) -> pd.DataFrame:
    """One row per stretch of a step with no device activity (CPU traces: neither compute nor
    communication), with what the host was doing: data_loading, synchronisation, launch_bound
    (busy dispatching ops, it launched the next work only after the device had gone idle) or
    other (docs/definitions.md, "Idle gaps"). `kind_layers`: (trace_kind, trace_layers) of
    the trace, where the caller has them."""
    steps, starts, ends = window_bounds(trace)
    if steps.size == 0:
        return idle_gaps_empty()
    if kind_layers is None:
        kind = trace_kind(trace)
        kind_layers = kind, trace_layers(trace, kind)
    kind, (active, _) = kind_layers
    events = trace.events
    # Idle is the time in no layer at all, for both kinds (on CPU, training-thread comm lies
    # within comm anywhere, so no state outside all layers is compute or communication).
    busy = (np.concatenate([s for s, _ in active]), np.concatenate([e for _, e in active]))
    u_starts, u_ends = intervals.union(*busy)
    rows_start, rows_end, rows_step = [], [], []
    for step, start, end in zip(steps.tolist(), starts.tolist(), ends.tolist()):
        # Only the busy intervals reaching into this window matter.
        lo = np.searchsorted(u_ends, start, side="right")
        hi = np.searchsorted(u_starts, end, side="left")
        g_start, g_end = intervals.gaps(u_starts[lo:hi], u_ends[lo:hi], start, end)
        rows_start.append(g_start)
        rows_end.append(g_end)
        rows_step.append(np.full(g_start.size, step, dtype=np.int64))
    gap_starts = np.concatenate(rows_start)
    gap_ends = np.concatenate(rows_end)
    gap_len = gap_ends - gap_starts

    names = events["name"]
    host = cat_is(events, HOST_OP_CATS | {PYTHON_CAT})
    runtime = cat_is(events, RUNTIME_CATS)
    launch_calls = runtime & (events["correlation"].to_numpy() >= 0)
    loading = host & matches(names, lambda n: bool(DATA_LOADING_RE.search(n)), among=host)
    host_or_runtime = runtime | host
    sync = host_or_runtime & matches(names, lambda n: bool(SYNC_RE.search(n)),
                                     among=host_or_runtime)
    loading_share = _overlap_with(gap_starts, gap_ends, pair(events, loading))
    sync_share = _overlap_with(gap_starts, gap_ends, pair(events, sync))
    ops_share = _overlap_with(gap_starts, gap_ends,
                              pair(events, _launching_ops(events, launch_calls)))

    # Host-caused: the work that ends the gap was launched after the device had gone idle (or
    # its launch is unknown). A gap before work that was already queued is the device's own.
    # Launch bound: host-caused while the launching threads were busy in ops (dispatching).
    if kind == "gpu":
        known, launched_late = _next_launch(events, launch_calls, gap_starts, gap_ends)
        host_caused = ~known | launched_late
    else:
        launched_late = np.zeros(gap_starts.size, dtype=bool)
        host_caused = np.ones(gap_starts.size, dtype=bool)
    activity = np.full(gap_starts.size, "other", dtype=object)
    activity[launched_late & (2 * ops_share >= gap_len)] = "launch_bound"
    activity[host_caused & (2 * sync_share >= gap_len)] = "synchronisation"
    activity[host_caused & (2 * loading_share >= gap_len)] = "data_loading"
    # Built in IDLE_GAP_COLUMNS' order: selecting them again would copy the frame.
    return pd.DataFrame({
        "rank": known_rank(trace), "step": np.concatenate(rows_step), "start_ns": gap_starts,
        "end_ns": gap_ends, "dur_ns": gap_len, "host_activity": activity,
    })


def _launching_ops(events: pd.DataFrame, launch_calls: np.ndarray) -> np.ndarray:
    """cpu_op events on the threads that make `launch_calls` (runtime/driver calls with a
    correlation id: the host side of device work)."""
    threads = threads_of(events, launch_calls)
    return cat_is(events, {CPU_OP_CAT}) & on_threads(events, threads)


def _next_launch(events: pd.DataFrame, launch_calls: np.ndarray, gap_starts: np.ndarray,
                 gap_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each gap, about the device work that ends it (the first to start at or after the
    gap's end): is its launch call in the trace, and was it made at or after the gap began?"""
    ts = events["ts_ns"].to_numpy()
    correlation = events["correlation"].to_numpy()
    device = np.flatnonzero(events["is_gpu"].to_numpy())
    device = device[np.argsort(ts[device], kind="stable")]
    launch = np.flatnonzero(launch_calls)
    if device.size == 0 or launch.size == 0 or gap_starts.size == 0:
        nothing = np.zeros(gap_starts.size, dtype=bool)
        return nothing, nothing.copy()
    # The earliest launch call of each correlation id, looked up by binary search.
    launch = launch[np.lexsort((ts[launch], correlation[launch]))]
    ids, first = np.unique(correlation[launch], return_index=True)
    launch_ts = ts[launch][first]
    following = device[np.minimum(np.searchsorted(ts[device], gap_ends, side="left"),
                                  device.size - 1)]
    has_next = ts[following] >= gap_ends
    wanted = correlation[following]
    slot = np.minimum(np.searchsorted(ids, wanted), ids.size - 1)
    known = has_next & (ids[slot] == wanted)
    return known, known & (launch_ts[slot] >= gap_starts)


def label_peer_waits(gaps: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """`gaps` (idle_gaps rows) with those at least half inside their rank's wait windows
    (rank, start_ns, end_ns on the rank's trace clock: analysis.crossrank.waits.wait_windows)
    labelled waiting_for_peers, unless the host was loading data (docs/definitions.md)."""
    if gaps.empty or windows is None or windows.empty:
        return gaps
    labelled = gaps.copy()
    labels = labelled["host_activity"]
    # The gaps a wait may relabel, grouped by rank once (not a scan of every gap per rank).
    candidates = np.flatnonzero(labels.isin(PEER_WAIT_OVERRIDES).to_numpy(dtype=bool))
    candidate_ranks = labelled["rank"].iloc[candidates].reset_index(drop=True)
    by_rank = candidate_ranks.groupby(candidate_ranks).indices
    gap_starts = labelled["start_ns"].to_numpy()
    gap_ends = labelled["end_ns"].to_numpy()
    waiting = np.zeros(len(labelled), dtype=bool)
    for rank, own in windows.groupby("rank"):
        found = by_rank.get(rank)
        if found is None or found.size == 0:
            continue
        rows = candidates[found]
        starts, ends = gap_starts[rows], gap_ends[rows]
        waited = _overlap_with(starts, ends, (own["start_ns"].to_numpy(np.int64),
                                              own["end_ns"].to_numpy(np.int64)))
        waiting[rows[2 * waited >= ends - starts]] = True
    labelled["host_activity"] = labels.where(~waiting, WAITING_FOR_PEERS)
    return labelled


def idle_summary(gaps: pd.DataFrame) -> pd.DataFrame:
    """Idle time per rank and host activity: gaps, total_ns; ranks in order (those without a
    rank last, as one), activities in order within each, gaps without an activity left out.

    Counted into one slot per (rank, activity) code: a groupby over the millions of gaps of a
    thousand ranks costs most of a second. Integer durations are summed as integers (exact)."""
    if gaps.empty:
        return pd.DataFrame({"rank": [], "host_activity": [], "gaps": [], "total_ns": []})
    rank_codes, _ = pd.factorize(pd.to_numeric(gaps["rank"], errors="coerce"), sort=True,
                                 use_na_sentinel=False)
    codes, labels = pd.factorize(gaps["host_activity"], sort=True)
    kinds = max(len(labels), 1)
    slots = (int(rank_codes.max()) + 1) * kinds
    slot = rank_codes.astype(np.int64) * kinds + codes
    durations = pd.to_numeric(gaps["dur_ns"], errors="coerce").to_numpy()
    counted = codes >= 0  # as a groupby leaves out a missing key
    slot, durations, rows = slot[counted], durations[counted], np.flatnonzero(counted)
    counts = np.bincount(slot, minlength=slots)
    totals = np.zeros(slots, dtype=durations.dtype)
    np.add.at(totals, slot, durations)
    used = np.flatnonzero(counts)
    # Each rank as its rows hold it (an integer stays one), read at any of its slot's gaps.
    held_at = np.zeros(slots, dtype=np.intp)
    held_at[slot] = rows
    return pd.DataFrame({
        "rank": gaps["rank"].array.take(held_at[used]),
        "host_activity": labels.take(used % kinds),
        "gaps": counts[used].astype(np.int64),
        "total_ns": totals[used],
    })


def idle_gaps_empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in IDLE_GAP_COLUMNS})
