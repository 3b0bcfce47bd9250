"""What a rank is doing at each moment of a step: the analysis windows and the activity layers.

A trace is a GPU trace when it has device activity, else a CPU trace. Its events are cut into
layers (compute, communication, copies on GPU; ops and communication on the training threads on
CPU); the set of layers active at a moment gives its state, and each state one of PARTS. The
definitions are in docs/definitions.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.event_kinds import (
    CPU_OP_CAT,
    HOST_OP_CATS,
    MEMORY_CATS,
    PROFILER_STEP_RE,
    STEP_COLUMNS,
)
from analysis.core.events import cat_is, distinct_names, matches
from analysis.core.model import RankTrace
from analysis.core.steps import WHOLE_TRACE_STEP

# The parts of a step's time, in the order of the state -> part tables below.
PARTS = ["compute_only_ns", "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns"]
_COMPUTE, _COMM, _OVERLAP, _MEMCPY, _IDLE = range(len(PARTS))


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


def window_bounds(trace: RankTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """step_windows' columns (step, start_ns, end_ns) as int64 arrays, without its frame."""
    if len(trace.steps):
        steps = trace.steps
        return tuple(steps[c].to_numpy(np.int64) for c in STEP_COLUMNS)
    windows = step_windows(trace)
    return tuple(windows[c].to_numpy(np.int64) for c in STEP_COLUMNS)


def pair(events: pd.DataFrame, mask: np.ndarray | None = None) -> intervals.Intervals:
    """(starts, ends) of the events where `mask` holds, without copying the frame."""
    starts, ends = events["ts_ns"].to_numpy(), events["end_ns"].to_numpy()
    return (starts, ends) if mask is None else (starts[mask], ends[mask])


def threads_of(events: pd.DataFrame, mask: np.ndarray) -> set[tuple[str, str]]:
    """(pid, tid) of the events where `mask` holds."""
    pid, tid = events["pid"], events["tid"]
    # Distinct (pid, tid) code pairs first: a handful of threads, not one string pair per row.
    # Codes are shifted by one so that -1 (missing) reads "nan", as str() of the missing value.
    pids, tids = ["nan"] + distinct_names(pid), ["nan"] + distinct_names(tid)
    width = len(tids)
    pairs = np.unique((pid.cat.codes.to_numpy()[mask].astype(np.int64) + 1) * width
                      + tid.cat.codes.to_numpy()[mask] + 1)
    return {(pids[pair // width], tids[pair % width]) for pair in pairs.tolist()}


def training_threads(events: pd.DataFrame) -> set[tuple[str, str]]:
    """(pid, tid) of the threads that run the training loop: those that record ProfilerStep#N.

    Without ProfilerStep, the thread with the most top-level cpu_op time.
    """
    is_step = (cat_is(events, HOST_OP_CATS)
               & matches(events["name"], lambda n: bool(PROFILER_STEP_RE.match(n))))
    if is_step.any():
        return threads_of(events, is_step)
    ops = cat_is(events, {CPU_OP_CAT})
    if not ops.any():
        return set()
    threads = threads_of(events, ops)
    busy = {key: intervals.total(*pair(events, ops & on_threads(events, {key})))
            for key in sorted(threads)}
    return {max(busy, key=busy.get)}


def on_threads(events: pd.DataFrame, threads: set[tuple[str, str]]) -> np.ndarray:
    """Whether each event is on one of `threads` ((pid, tid) as text). Distinct categories may
    share a text (7 and "7"): each code counts."""
    if not threads:
        return np.zeros(len(events), dtype=bool)
    pid_codes, tid_codes = _codes_by_text(events["pid"]), _codes_by_text(events["tid"])
    pid, tid = events["pid"].array, events["tid"].array
    # A row of flags per wanted pid code, one flag per tid code + 1, looked up by two gathers:
    # row 0 (every other pid, and code -1) and column 0 (tid code -1) stay False, and the table
    # stays the size of the wanted pids' rows however many categories the frame has.
    width = len(tid.categories) + 1
    row_of_pid = np.zeros(len(pid.categories) + 1, dtype=np.intp)  # the last for code -1
    rows = [np.zeros(width, dtype=bool)]
    for pid_text, tid_text in threads:
        for p in pid_codes.get(pid_text, ()):
            if not row_of_pid[p]:
                row_of_pid[p] = len(rows)
                rows.append(np.zeros(width, dtype=bool))
            for t in tid_codes.get(tid_text, ()):
                rows[row_of_pid[p]][t + 1] = True
    return np.concatenate(rows).take(row_of_pid.take(pid.codes) * width + tid.codes + 1)


def _codes_by_text(column: pd.Series) -> dict[str, list[int]]:
    codes: dict[str, list[int]] = {}
    for code, text in enumerate(distinct_names(column)):
        codes.setdefault(text, []).append(code)
    return codes


def _gpu_layers(events: pd.DataFrame) -> tuple[list[intervals.Intervals], np.ndarray]:
    is_gpu = events["is_gpu"].to_numpy()
    is_comm = events["is_comm"].to_numpy()
    memory = cat_is(events, MEMORY_CATS)
    compute = is_gpu & ~is_comm & ~memory
    comm = is_gpu & is_comm
    copies = is_gpu & memory & ~is_comm
    layers = [pair(events, compute), pair(events, comm), pair(events, copies)]
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
    host = cat_is(events, HOST_OP_CATS)
    comm = events["is_comm"].to_numpy() & host
    if not comm.any():
        return result
    starts, ends = events["ts_ns"].to_numpy(), events["end_ns"].to_numpy()
    for thread in threads:
        on_thread = on_threads(events, {thread})
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
    on_training = on_threads(events, threads)
    host = cat_is(events, HOST_OP_CATS)
    is_comm = events["is_comm"].to_numpy() & host
    ops = cat_is(events, {CPU_OP_CAT}) & on_training & ~is_comm
    blocking = is_comm & on_training & ~asynchronous_comm(events, threads)
    layers = [pair(events, ops), pair(events, blocking), pair(events, is_comm)]
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


def trace_layers(trace: RankTrace, kind: str) -> tuple[list[intervals.Intervals], np.ndarray]:
    """The layers of `trace` and the state -> part table (indices into PARTS)."""
    return _gpu_layers(trace.events) if kind == "gpu" else _cpu_layers(trace.events)
