"""Where each step's time goes, per rank: compute, communication, their overlap, copies, idle.

Pure functions from a RankTrace (analysis.load) to DataFrames; every definition used here is
written once in docs/definitions.md. `python -m analysis.breakdown PATH` is the command-line
report (docs/analysis.md), which also calls the collectives, per-rank and bottleneck analyses.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from analysis import intervals, output
from analysis.load import (WHOLE_TRACE_STEP, HOST_OP_CATS, MEMORY_CATS, PROFILER_STEP_RE,
                           STEP_COLUMNS, LoadResult, NothingToAnalyse, RankTrace, load_files,
                           parse_step_spec, resolve_runs)

PARTS = ["compute_only_ns", "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns"]
BREAKDOWN_COLUMNS = ["rank", "step", "step_ns", *PARTS, "exposed_comm_ns", "overlap_pct", "kind",
                     "start_ns", "end_ns"]
IDLE_GAP_COLUMNS = ["rank", "step", "start_ns", "end_ns", "dur_ns", "host_activity"]
HTA_COLUMNS = ["rank", "idle_us", "compute_us", "non_compute_us", "kernel_time_us", "note"]

_COMPUTE, _COMM, _OVERLAP, _MEMCPY, _IDLE = range(5)
DATA_LOADING_RE = re.compile(r"DataLoader|dataloader")
SYNC_RE = re.compile(
    r"Synchronize|^(?:cuda|hip)Mem(?:cpy|set)(?:WithStream)?$|^aten::_local_scalar_dense$")


# ---- windows and layers --------------------------------------------------------------------------
def trace_kind(trace: RankTrace) -> str:
    """'gpu' when the trace has device activity (kernels, copies, sets), else 'cpu'."""
    return "gpu" if bool(trace.events["is_gpu"].any()) else "cpu"


def step_windows(trace: RankTrace) -> pd.DataFrame:
    """The analysis windows: the selected steps, or the whole trace span when it has no steps."""
    if len(trace.steps):
        return trace.steps[STEP_COLUMNS].reset_index(drop=True)
    has_steps = trace.all_steps is not None and len(trace.all_steps)
    events = trace.events
    if has_steps or events.empty:
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in STEP_COLUMNS})
    return pd.DataFrame({"step": [WHOLE_TRACE_STEP], "start_ns": [int(events["ts_ns"].min())],
                         "end_ns": [int(events["end_ns"].max())]})


def _pair(events: pd.DataFrame, mask: Optional[np.ndarray] = None) -> intervals.Intervals:
    """(starts, ends) of the events where `mask` holds, without copying the frame."""
    starts, ends = events["ts_ns"].to_numpy(), events["end_ns"].to_numpy()
    return (starts, ends) if mask is None else (starts[mask], ends[mask])


def _cat_is(events: pd.DataFrame, cats) -> np.ndarray:
    return _matches(events["cat"], lambda c: c in cats)


def _threads_of(events: pd.DataFrame, mask: np.ndarray) -> set[tuple[str, str]]:
    """(pid, tid) of the events where `mask` holds."""
    pid, tid = events["pid"].to_numpy()[mask], events["tid"].to_numpy()[mask]
    return {(str(p), str(t)) for p, t in zip(pid, tid)}


def training_threads(events: pd.DataFrame) -> set[tuple[str, str]]:
    """(pid, tid) of the threads that run the training loop: those that record ProfilerStep#N.

    Without ProfilerStep, the thread with the most top-level cpu_op time.
    """
    is_step = (_cat_is(events, HOST_OP_CATS)
               & _matches(events["name"], lambda n: bool(PROFILER_STEP_RE.match(n))))
    if is_step.any():
        return _threads_of(events, is_step)
    ops = _cat_is(events, {"cpu_op"})
    if not ops.any():
        return set()
    threads = _threads_of(events, ops)
    busy = {key: intervals.total(*_pair(events, ops & _on_threads(events, {key})))
            for key in sorted(threads)}
    return {max(busy, key=busy.get)}


def _on_threads(events: pd.DataFrame, threads: set[tuple[str, str]]) -> np.ndarray:
    if not threads:
        return np.zeros(len(events), dtype=bool)
    pids = {p for p, _ in threads}
    tids = {t for _, t in threads}
    candidate = (_matches(events["pid"], lambda p: p in pids)
                 & _matches(events["tid"], lambda t: t in tids))
    rows = np.flatnonzero(candidate)
    pid, tid = events["pid"].to_numpy()[rows], events["tid"].to_numpy()[rows]
    on = np.zeros(len(events), dtype=bool)
    on[rows] = [(str(p), str(t)) in threads for p, t in zip(pid, tid)]
    return on


def _gpu_layers(events: pd.DataFrame) -> tuple[list[intervals.Intervals], np.ndarray]:
    is_gpu = events["is_gpu"].to_numpy()
    is_comm = events["is_comm"].to_numpy()
    memory = _cat_is(events, MEMORY_CATS)
    compute = is_gpu & ~is_comm & ~memory
    comm = is_gpu & is_comm
    copies = is_gpu & memory & ~is_comm
    layers = [_pair(events, compute), _pair(events, comm), _pair(events, copies)]
    # bits: 1 compute, 2 communication, 4 copy/set
    category = np.array([_IDLE, _COMPUTE, _COMM, _OVERLAP, _MEMCPY, _COMPUTE, _COMM, _OVERLAP])
    return layers, category


def asynchronous_comm(events: pd.DataFrame, threads: set[tuple[str, str]]) -> np.ndarray:
    """Host comm events on `threads` that outlive an event they started inside, on their thread.

    Host events of one thread nest; an event that starts inside another and ends after it is not
    a scope of the thread's own but a record left open by asynchronous work: the `gloo:send` /
    `gloo:recv` of an isend/irecv starts inside `c10d::send` and lasts until `wait()` returns.
    Ops that run meanwhile are the thread's own work, not part of it (docs/definitions.md).
    """
    result = np.zeros(len(events), dtype=bool)
    host = _cat_is(events, HOST_OP_CATS)
    comm = events["is_comm"].to_numpy() & host
    if not comm.any():
        return result
    starts, ends = events["ts_ns"].to_numpy(), events["end_ns"].to_numpy()
    for thread in threads:
        on_thread = _on_threads(events, {thread})
        candidates = np.flatnonzero(comm & on_thread)
        if candidates.size == 0:
            continue
        others = np.flatnonzero(host & on_thread)
        by_end = others[np.argsort(ends[others], kind="stable")]
        sorted_ends = ends[by_end]
        # An event P crossed by E: P.start < E.start < P.end < E.end. Among the events ending
        # inside (E.start, E.end), is the earliest start before E's?
        lo = np.searchsorted(sorted_ends, starts[candidates], side="right")
        hi = np.searchsorted(sorted_ends, ends[candidates], side="left")
        padded = np.append(starts[by_end], np.iinfo(np.int64).max)
        earliest = np.minimum.reduceat(padded, np.column_stack((lo, hi)).ravel())[0::2]
        result[candidates] = (lo < hi) & (earliest < starts[candidates])
    return result


def _cpu_layers(events: pd.DataFrame) -> tuple[list[intervals.Intervals], np.ndarray]:
    threads = training_threads(events)
    on_training = _on_threads(events, threads)
    host = _cat_is(events, HOST_OP_CATS)
    is_comm = events["is_comm"].to_numpy() & host
    ops = _cat_is(events, {"cpu_op"}) & on_training & ~is_comm
    blocking = is_comm & on_training & ~asynchronous_comm(events, threads)
    layers = [_pair(events, ops), _pair(events, blocking), _pair(events, is_comm)]
    # bits: 1 op on a training thread, 2 blocking comm on a training thread, 4 comm anywhere. A
    # training thread inside a blocking comm op is communicating, not computing, even inside an
    # enclosing op; an asynchronous one is in flight while the thread computes (overlap).
    category = np.empty(8, dtype=np.int64)
    for state in range(8):
        computing = bool(state & 1) and not state & 2
        communicating = bool(state & 4)
        category[state] = (_OVERLAP if computing and communicating else _COMPUTE if computing
                           else _COMM if communicating else _IDLE)
    return layers, category


def _layers(trace: RankTrace, kind: str):
    return _gpu_layers(trace.events) if kind == "gpu" else _cpu_layers(trace.events)


# ---- per-step breakdown --------------------------------------------------------------------------
def empty_breakdown() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in BREAKDOWN_COLUMNS})
    frame["rank"] = frame["rank"].astype(object)
    frame["overlap_pct"] = frame["overlap_pct"].astype("float64")
    frame["kind"] = frame["kind"].astype(object)
    return frame


def breakdown_per_step(trace: RankTrace) -> pd.DataFrame:
    """One row per step: its time split into compute only, communication only, overlap,
    memory copy/set and idle (these five add up to step_ns exactly), plus exposed communication
    and the share of communication hidden by compute."""
    windows = step_windows(trace)
    if windows.empty:
        return empty_breakdown()
    kind = trace_kind(trace)
    layers, category = _layers(trace, kind)
    starts = windows["start_ns"].to_numpy(np.int64)
    ends = windows["end_ns"].to_numpy(np.int64)
    by_state = intervals.state_durations(layers, starts, ends)
    parts = np.zeros((len(windows), len(PARTS)), dtype=np.int64)
    for state, part in enumerate(category):
        parts[:, part] += by_state[:, state]
    frame = pd.DataFrame(parts, columns=PARTS)
    frame.insert(0, "rank", trace.rank)
    frame.insert(1, "step", windows["step"].to_numpy(np.int64))
    frame.insert(2, "step_ns", ends - starts)
    frame["exposed_comm_ns"] = frame["comm_only_ns"]
    frame["overlap_pct"] = overlap_pct(frame["overlap_ns"], frame["comm_only_ns"])
    frame["kind"] = kind
    frame["start_ns"] = starts
    frame["end_ns"] = ends
    return frame[BREAKDOWN_COLUMNS]


def overlap_pct(overlap_ns, comm_only_ns):
    """Percentage of communication time during which compute also ran (NaN without comm)."""
    overlap_ns = np.asarray(overlap_ns, dtype=np.float64)
    comm = overlap_ns + np.asarray(comm_only_ns, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(comm > 0, 100.0 * overlap_ns / np.where(comm > 0, comm, 1.0), np.nan)


def rank_totals(per_step: pd.DataFrame) -> pd.DataFrame:
    """The per-step breakdown summed over each rank's steps (overlap_pct from the sums)."""
    if per_step.empty:
        return empty_breakdown().drop(columns=["step", "start_ns", "end_ns"]).assign(steps=0)
    ns_columns = ["step_ns", *PARTS, "exposed_comm_ns"]
    key = per_step["rank"].astype(object).where(per_step["rank"].notna(), "?")
    grouped = per_step.groupby(key, sort=False)
    totals = grouped[ns_columns].sum().astype("int64")
    totals["steps"] = grouped.size()
    totals["kind"] = grouped["kind"].first()
    totals["overlap_pct"] = overlap_pct(totals["overlap_ns"], totals["comm_only_ns"])
    totals = totals.reset_index(drop=True)
    totals.insert(0, "rank", grouped["rank"].first().to_numpy())
    return totals[["rank", "steps", "step_ns", *PARTS, "exposed_comm_ns", "overlap_pct", "kind"]]


# ---- idle gaps -----------------------------------------------------------------------------------
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


def idle_gaps(trace: RankTrace) -> pd.DataFrame:
    """One row per stretch of a step with no device activity (CPU traces: neither compute nor
    communication), with what the host was doing: data_loading, synchronisation, launch_bound
    (busy dispatching ops, it launched the next work only after the device had gone idle) or
    other (docs/definitions.md, "Idle gaps")."""
    windows = step_windows(trace)
    if windows.empty:
        return idle_gaps_empty()
    kind = trace_kind(trace)
    events = trace.events
    layers, _ = _layers(trace, kind)
    # Idle is the time in no layer at all, for both kinds (on CPU, training-thread comm lies
    # within comm anywhere, so no state outside all layers is compute or communication).
    busy = (np.concatenate([s for s, _ in layers]), np.concatenate([e for _, e in layers]))
    u_starts, u_ends = intervals.union(*busy)
    rows_start, rows_end, rows_step = [], [], []
    for step, start, end in windows.itertuples(index=False):
        # Only the busy intervals reaching into this window matter.
        lo = np.searchsorted(u_ends, start, side="right")
        hi = np.searchsorted(u_starts, end, side="left")
        g_start, g_end = intervals.gaps(u_starts[lo:hi], u_ends[lo:hi], int(start), int(end))
        rows_start.append(g_start)
        rows_end.append(g_end)
        rows_step.append(np.full(g_start.size, step, dtype=np.int64))
    gap_starts = np.concatenate(rows_start)
    gap_ends = np.concatenate(rows_end)
    gap_len = gap_ends - gap_starts

    names = events["name"]
    host = _cat_is(events, HOST_OP_CATS | {"python_function"})
    loading = host & _matches(names, lambda n: bool(DATA_LOADING_RE.search(n)))
    runtime = _cat_is(events, {"cuda_runtime", "cuda_driver"})
    sync = (runtime | host) & _matches(names, lambda n: bool(SYNC_RE.search(n)))
    loading_share = _overlap_with(gap_starts, gap_ends, _pair(events, loading))
    sync_share = _overlap_with(gap_starts, gap_ends, _pair(events, sync))
    ops_share = _overlap_with(gap_starts, gap_ends, _pair(events, _launching_ops(events)))

    # Host-caused: the work that ends the gap was launched after the device had gone idle (or
    # its launch is unknown). A gap before work that was already queued is the device's own.
    # Launch bound: host-caused while the launching threads were busy in ops (dispatching).
    if kind == "gpu":
        known, launched_late = _next_launch(events, gap_starts, gap_ends)
        host_caused = ~known | launched_late
    else:
        launched_late = np.zeros(gap_starts.size, dtype=bool)
        host_caused = np.ones(gap_starts.size, dtype=bool)
    activity = np.full(gap_starts.size, "other", dtype=object)
    activity[launched_late & (2 * ops_share >= gap_len)] = "launch_bound"
    activity[host_caused & (2 * sync_share >= gap_len)] = "synchronisation"
    activity[host_caused & (2 * loading_share >= gap_len)] = "data_loading"
    return pd.DataFrame({
        "rank": trace.rank, "step": np.concatenate(rows_step), "start_ns": gap_starts,
        "end_ns": gap_ends, "dur_ns": gap_len, "host_activity": activity,
    })[IDLE_GAP_COLUMNS]


def _launch_calls(events: pd.DataFrame) -> np.ndarray:
    """Runtime/driver calls with a correlation id: the host side of device work."""
    return (_cat_is(events, {"cuda_runtime", "cuda_driver"})
            & (events["correlation"].to_numpy() >= 0))


def _launching_ops(events: pd.DataFrame) -> np.ndarray:
    """cpu_op events on the threads that launch device work."""
    threads = _threads_of(events, _launch_calls(events))
    return _cat_is(events, {"cpu_op"}) & _on_threads(events, threads)


def _next_launch(events: pd.DataFrame, gap_starts: np.ndarray, gap_ends: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """For each gap, about the device work that ends it (the first to start at or after the
    gap's end): is its launch call in the trace, and was it made at or after the gap began?"""
    ts = events["ts_ns"].to_numpy()
    correlation = events["correlation"].to_numpy()
    device = np.flatnonzero(events["is_gpu"].to_numpy())
    device = device[np.argsort(ts[device], kind="stable")]
    launch = np.flatnonzero(_launch_calls(events))
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


def idle_summary(gaps: pd.DataFrame) -> pd.DataFrame:
    """Idle time per rank and host activity: gaps, total_ns."""
    if gaps.empty:
        return pd.DataFrame({"rank": [], "host_activity": [], "gaps": [], "total_ns": []})
    key = gaps["rank"].astype(object).where(gaps["rank"].notna(), "?")
    summary = (gaps.assign(_rank=key).groupby(["_rank", "host_activity"], sort=True)
               .agg(gaps=("dur_ns", "size"), total_ns=("dur_ns", "sum")).reset_index())
    summary["rank"] = summary["_rank"].where(summary["_rank"] != "?", None)
    return summary[["rank", "host_activity", "gaps", "total_ns"]]


# ---- HTA-compatible columns ----------------------------------------------------------------------
# HTA 0.5.0's kernel classes, regular expressions copied as they are (their precedence quirks
# included): communication ^nccl.*Kernel; memory ^Memcpy|^Memset|^dma; non-compute also
# anything containing Memcpy or Sync.
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
HTA_DEVICE_SYNC_NAMES = ("Event Sync", "Context Sync")


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
    kept = _matches(trace.events["cat"], lambda c: c not in ("", "trace"))
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
        step_names.update(c for c in _categories(trace.events["name"]) if "ProfilerStep" in c)
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


def _categories(names: pd.Series) -> list[str]:
    if isinstance(names.dtype, pd.CategoricalDtype):
        return [str(c) for c in names.cat.categories]
    return [str(c) for c in names.unique()]


def _matches(column: pd.Series, wanted) -> np.ndarray:
    """wanted(str(value)) for each row, evaluated once per distinct value of a categorical."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        hits = np.array([wanted(str(c)) for c in column.cat.categories], dtype=bool)
        codes = column.cat.codes.to_numpy()
        return np.where(codes >= 0, hits[np.maximum(codes, 0)] if hits.size else False, False)
    return column.astype(str).map(wanted).to_numpy(dtype=bool)


def _hta_rank(trace: RankTrace, ts: np.ndarray, end: np.ndarray, kept: np.ndarray,
              step_names: set[str], filtering: bool) -> dict:
    row = {"rank": trace.rank, "idle_us": np.nan, "compute_us": np.nan,
           "non_compute_us": np.nan, "kernel_time_us": np.nan, "note": ""}
    events = trace.events
    names = events["name"]
    stream = events["stream"].to_numpy()
    correlation = events["correlation"].to_numpy()
    on_device = kept & (((stream >= 0) & (correlation >= 0))
                        | _matches(names, lambda n: n in HTA_DEVICE_SYNC_NAMES))
    on_host = kept & ~on_device
    if filtering:
        is_step = on_host & _matches(names, lambda n: n in step_names)
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
    compute = kernels & _matches(names, hta_is_compute)
    compute_busy = intervals.hta_merged(ts[compute], end[compute])[0] if compute.any() else 0.0
    kernel_time = last - first
    idle = kernel_time - busy
    row.update(idle_us=idle, compute_us=compute_busy,
               non_compute_us=kernel_time - compute_busy - idle, kernel_time_us=kernel_time)
    return row


# ---- the whole run -------------------------------------------------------------------------------
def analyse_run(loaded: LoadResult, name: str, path: str, steps_spec: Optional[str] = None,
                hta_compatible: bool = False) -> output.RunReport:
    """All the tables for one loaded run: ours, then the communication, rank and bottleneck
    analyses (analysis.communication, .ranks, .bottlenecks). A table that fails becomes a problem
    naming it, and the rest is still reported."""
    problems = list(loaded.problems)
    ranks = loaded.ranks
    per_step = pd.concat([breakdown_per_step(t) for t in ranks] or [empty_breakdown()],
                         ignore_index=True)
    gaps = pd.concat([idle_gaps(t) for t in ranks] or [idle_gaps_empty()], ignore_index=True)
    report = output.RunReport(
        name=name, path=path, files=[str(f) for f in loaded.files],
        world_size=loaded.world_size, steps_spec=steps_spec, hta_compatible=hta_compatible,
        problems=problems, ranks=ranks, per_step=per_step, totals=rank_totals(per_step),
        hta=hta_temporal_breakdown(ranks), idle=idle_summary(gaps), idle_gaps=gaps)

    def table(name: str, module: str, build):
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            report.unavailable[name] = f"{module} cannot be imported: {exc}"
            return None
        try:
            result = build(imported)
        except Exception as exc:  # one table's failure must not cost the others
            problems.append(f"{name} table failed: {type(exc).__name__}: {exc}")
            report.unavailable[name] = f"{type(exc).__name__}: {exc}"
            return None
        report.tables[name] = result
        return result

    ops = table("comm_ops", "analysis.communication",
                lambda m: pd.concat([m.comm_ops(t) for t in ranks] or [m.empty_ops()],
                                    ignore_index=True))
    collectives = None
    if ops is not None:
        collectives = table("collectives", "analysis.communication",
                            lambda m: m.collectives_table(ops))
    per_rank = table("per_rank", "analysis.ranks", lambda m: m.per_rank_table(per_step, ranks))
    step_table = table("per_step", "analysis.ranks", lambda m: m.per_step_table(per_step, ranks))
    table("bottlenecks", "analysis.bottlenecks",
          lambda m: m.find_bottlenecks(step_table if step_table is not None else per_step,
                                       per_rank, collectives, gaps, ranks))
    return report


def idle_gaps_empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in IDLE_GAP_COLUMNS})


# ---- command line --------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.breakdown",
        description="Time breakdown, collectives and bottlenecks of a traced training run "
                    "(docs/analysis.md).")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a run folder, a folder of runs (the newest is analysed), or "
                             "Kineto trace files")
    parser.add_argument("--run", metavar="NAME", help="the run to analyse in a folder of runs")
    parser.add_argument("--all", action="store_true", help="analyse every run in a folder of runs")
    parser.add_argument("--steps", metavar="SPEC",
                        help="ProfilerStep numbers to analyse, e.g. 3-5,7 (default: all)")
    parser.add_argument("--hta-compatible", action="store_true",
                        help="select steps as HTA does: drop the last ProfilerStep")
    parser.add_argument("--format", choices=("text", "json", "csv"), default="text",
                        help="standard output: tables, one JSON document, or the per-step CSV")
    parser.add_argument("--out", metavar="DIR", type=Path,
                        help="also write every table as CSV into DIR")
    parser.add_argument("--strict", action="store_true",
                        help="exit non-zero on any problem, not only when nothing was analysed")
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the .ranktrace-cache Parquet files")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="processes for parsing trace files (default: one per core)")
    parser.add_argument("--comm-kernel", action="append", default=[], metavar="REGEX",
                        type=_regex,
                        help="device kernels whose name matches REGEX (searched, case-"
                             "sensitive) also count as communication; repeatable")
    return parser


def _regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({exc})")


def main(argv: Optional[list[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        steps = parse_step_spec(args.steps) if args.steps else None
    except ValueError as exc:
        parser.error(str(exc))
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        runs = resolve_runs([Path(p) for p in args.paths], run=args.run, all_runs=args.all)
    except NothingToAnalyse as exc:
        print(f"ranktrace: nothing analysed: {exc}", file=sys.stderr)
        return 1

    reports = []
    for run_dir, files in runs:
        loaded = load_files(files, run_dir, steps=steps, hta_compatible=args.hta_compatible,
                            use_cache=not args.no_cache, jobs=args.jobs, progress=True,
                            comm_kernels=tuple(args.comm_kernel))
        where = run_dir if run_dir is not None else Path(args.paths[0])
        report = analyse_run(loaded, name=where.name or str(where), path=str(where),
                             steps_spec=args.steps, hta_compatible=args.hta_compatible)
        for problem in report.problems:
            print(f"ranktrace: warning: {problem}", file=sys.stderr)
        reports.append(report)
        if args.out is not None:
            out_dir = args.out / report.name if len(runs) > 1 else args.out
            try:
                output.write_csvs(report, out_dir)
            except OSError as exc:
                message = f"--out {out_dir}: cannot write ({exc.strerror or exc})"
                report.problems.append(message)
                print(f"ranktrace: error: {message}", file=sys.stderr)

    if args.format == "json":
        print(output.dumps(output.json_document(reports)))
    elif args.format == "csv":
        tables = [r.step_table().assign(run=r.name) for r in reports]
        pd.concat(tables, ignore_index=True).to_csv(sys.stdout, index=False)
    else:
        print("\n".join(output.text_report(r) for r in reports), end="")

    analysed = any(not output.nothing_analysed(r) for r in reports)
    if not analysed:
        reasons = "; ".join(p for r in reports for p in r.problems) or "no step to analyse"
        print(f"ranktrace: nothing analysed: {reasons}", file=sys.stderr)
        return 1
    if args.strict and any(r.problems for r in reports):
        count = sum(len(r.problems) for r in reports)
        print(f"ranktrace: --strict: {count} problem(s), see the warnings above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
