"""Adapters from a loaded run (analysis.ingest.load) to the plain frames the cross-rank pass reads.

The cross-rank functions take one frame of ops (OP_COLUMNS, each rank's times on its own clock),
one of steps (STEP_COLUMNS) and one of clock_sync offsets (SYNC_COLUMNS); this module is the only
one that knows `LoadResult`. Ops come from the tracer's comm records where a rank has them, else
from its Kineto events: `gloo:*` ops on CPU, NCCL/RCCL kernels on GPU (definitions in
docs/cross-rank.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS, UNKNOWN_PG, canonical_dtype, canonical_op
from analysis.core.model import UNKNOWN_RANK
from analysis.core.steps import FIRST_TRAINING_STEP, step_at
from analysis.crossrank.distinct import by_value as _by_value
from analysis.crossrank.distinct import float64_of
from analysis.rank.comm.comm_ops import windows_hold_what_records_lack
from analysis.rank.comm.profiled import (
    FROM_PROFILED,
    FROM_RECORDS,
    FROM_TRACE,
    pair_with_profiled,
)
from analysis.rank.comm.sizes import distinct_message_sizes
from analysis.rank.step_evidence import HostSpans
from tracer import schema

OP_COLUMNS = ["rank", "pg", "pg_size", "op", "bytes", "dtype", "step", "issue_ns", "end_ns",
              "peer", "queue", "timed", "time_from"]
# A comm record whose backend gave no completion (gloo's Flight Recorder entries): its end is its
# issue, and only its issue is known (docs/cross-rank.md, "Ops timed at issue only").
ISSUE_ONLY = "issue"
STEP_COLUMNS = ["rank", "step", "start_ns", "end_ns"]
SYNC_COLUMNS = ["rank", "offset_ns", "uncertainty_ns"]


def empty_ops() -> pd.DataFrame:
    return typed_ops(pd.DataFrame({c: [] for c in OP_COLUMNS}))


def typed_ops(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.reindex(columns=OP_COLUMNS)
    for column in ("rank", "pg_size", "step", "issue_ns", "end_ns"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("int64")
    frame["peer"] = pd.to_numeric(frame["peer"], errors="coerce").astype("float64")
    frame["bytes"] = pd.to_numeric(frame["bytes"], errors="coerce").astype("float64")
    # An op's end is known unless said otherwise (Kineto events and timed records have one).
    frame["timed"] = frame["timed"].astype("object").where(frame["timed"].notna(), True).astype(
        bool)
    # Where a timed op's end comes from (rank.comm.profiled); None for an op without one.
    frame["time_from"] = frame["time_from"].astype("object").where(
        frame["time_from"].notna() & frame["timed"], None)
    for column in ("pg", "op", "dtype", "queue", "time_from"):
        frame[column] = frame[column].astype("object")
    return frame.reset_index(drop=True)


def ops_from_records(comms: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One rank's comm records (tracer.schema.CommRecord) as ops, in the order the rank issued
    them: records written off the training thread (the native ones) come later in the file than
    their issue, and positions are counted in row order (crossrank.matching). A record timed at
    issue only (`timing` "issue") has `timed` False: its end is not known."""
    if comms is None or comms.empty:
        return empty_ops()
    frame = comms.dropna(subset=["start_ns", "end_ns", "step", "op"])
    ops = frame["op"].map(lambda op: op if op in schema.COMM_OPS else canonical_op(op))
    timing = frame["timing"] if "timing" in frame.columns else pd.Series(None, index=frame.index)
    frame = pd.DataFrame({
        "rank": rank, "pg": frame["pg"].astype(str), "pg_size": frame["pg_size"],
        "op": ops, "bytes": frame["bytes"], "dtype": frame["dtype"].map(canonical_dtype),
        "step": frame["step"], "issue_ns": frame["start_ns"], "end_ns": frame["end_ns"],
        "peer": frame["peer"] if "peer" in frame.columns else np.nan,
        "timed": (timing != ISSUE_ONLY).to_numpy(),
        "time_from": FROM_RECORDS,
    })
    frame = frame[frame["op"].notna() & (frame["step"] >= FIRST_TRAINING_STEP)]
    frame = frame.sort_values("issue_ns", kind="stable")
    frame["queue"] = _queues(frame)
    return typed_ops(frame)


def _queues(frame: pd.DataFrame) -> pd.Series:
    """Ops on one queue run one after another: a group's collectives, or one p2p direction."""
    is_p2p = frame["op"].isin(P2P_OPS)
    p2p = frame["pg"] + ":" + frame["op"] + ":" + frame["peer"].astype(str)
    return frame["pg"].where(~is_p2p, p2p)


def _nelems_of_dims(text) -> float:
    """Elements of the first tensor (or tensor list) in a Kineto `Input Dims` argument."""
    try:
        dims = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return math.nan
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return math.nan
    first = dims[0]
    if first and all(isinstance(d, list) for d in first):
        return float(sum(math.prod(d) for d in first))
    if first and all(isinstance(d, (int, float)) for d in first):
        return float(math.prod(first))
    return math.nan


def ops_from_events(comm: pd.DataFrame, steps: pd.DataFrame, world_size) -> pd.DataFrame:
    """Ops from the communication events (`is_comm`) of any number of ranks, with a `rank`
    column: NCCL kernels on a rank that has them (GPU), else its `gloo:*` ops (CPU). `steps`
    holds each rank's ProfilerStep spans (rank, step, start_ns, end_ns).

    A kernel's start is when it began waiting for its peers on the device and its end when the
    op completed there, so kernels are the ops on GPU; their stream is their queue. All ranks
    are done at once: per-rank pandas calls would cost more than the work on a large run.
    """
    if comm is None or comm.empty:
        return empty_ops()
    names = comm["name"].astype(str)
    is_gpu = comm["is_gpu"].astype(bool).to_numpy()
    gpu_ranks = set(comm.loc[is_gpu, "rank"].unique())
    on_gpu = comm["rank"].isin(gpu_ranks).to_numpy()
    chosen = comm[(is_gpu & on_gpu) | (~on_gpu & names.str.startswith("gloo:").to_numpy())]
    if chosen.empty:
        return empty_ops()
    name_op = _by_value(chosen["name"].astype(str), canonical_op)
    kernel = chosen["is_gpu"].astype(bool).to_numpy()
    issue = chosen["ts_ns"].astype("int64")
    if not kernel.all():
        gloo = ~kernel
        issue[gloo] = _gloo_issue(chosen[gloo], name_op[gloo], comm[~on_gpu])
    op = _by_value(chosen["collective"], canonical_op)
    op = op.where(op.notna(), name_op)
    dtype = _by_value(chosen["comm_dtype"], canonical_dtype)
    if "input_type" in chosen.columns:
        typed = _by_value(chosen["input_type"], lambda t: canonical_dtype(_first_text(t)))
        dtype = dtype.where(dtype.notna(), typed)
    size = world_size if world_size else np.nan
    group_size = chosen["group_size"].fillna(size)
    in_nelems = chosen["in_nelems"]
    if "input_dims" in chosen.columns:
        in_nelems = in_nelems.where(in_nelems.notna(),
                                    _by_value(chosen["input_dims"], _nelems_of_dims))
    pg = _by_value(chosen["pg_name"], lambda v: UNKNOWN_PG if v is None or v != v else str(v))
    queue = np.where(kernel, chosen["stream"].astype(str).to_numpy(), pg.to_numpy())
    step = _steps_by_rank(chosen["rank"].to_numpy(), issue.to_numpy(), steps)
    # typed_ops of the kept rows sorted by rank and issue, built from arrays at once: the
    # columns mostly have their types already.
    kept = np.flatnonzero(op.notna().to_numpy() & ~np.isnan(step))
    ranks, issued = chosen["rank"].to_numpy(), issue.to_numpy()
    order = kept[np.lexsort((issued[kept], ranks[kept]))]
    sizes, inverse = distinct_message_sizes(op, in_nelems, chosen["out_nelems"], dtype,
                                             group_size)
    return pd.DataFrame({
        "rank": ranks[order], "pg": _objects_at(pg, order),
        "pg_size": _int64_at(group_size.fillna(0), order), "op": _objects_at(op, order),
        "bytes": float64_of(sizes)[inverse[order]], "dtype": _objects_at(dtype, order),
        "step": step[order].astype("int64"), "issue_ns": issued[order],
        "end_ns": _int64_at(chosen["end_ns"], order), "peer": np.full(len(order), np.nan),
        "queue": pd.Series(queue[order], dtype=object, copy=False),
        "timed": np.ones(len(order), dtype=bool),
        "time_from": pd.Series(np.full(len(order), FROM_TRACE, dtype=object), dtype=object,
                               copy=False)})


def _objects_at(column: pd.Series, order: np.ndarray) -> pd.Series:
    return pd.Series(column.to_numpy(dtype=object)[order], dtype=object, copy=False)


def _int64_at(column: pd.Series, order: np.ndarray) -> np.ndarray:
    """typed_ops' int64 of the column's values at `order` (numbers, or objects holding them)."""
    return pd.to_numeric(column.to_numpy()[order], errors="coerce").astype("int64")


def _gloo_issue(gloo: pd.DataFrame, gloo_op: pd.Series, comm: pd.DataFrame) -> pd.Series:
    """When each gloo op was issued: the start of the host call that queued it (`c10d::*` or
    `record_param_comms` on the training thread), else its own start.

    gloo's worker thread starts an op when it dequeues it, which can be long after the training
    thread issued it; that thread's call is the issue. A gloo op is paired with the latest call
    of the same op that started no later than it, each call with one op at most.
    """
    host = comm[~comm["is_gpu"].astype(bool) & ~comm["name"].astype(str).str.startswith("gloo:")]
    issue = gloo["ts_ns"].astype("int64").copy()
    if host.empty:
        return issue
    call_op = _by_value(host["collective"], canonical_op)
    call_op = call_op.where(call_op.notna(), _by_value(host["name"].astype(str), canonical_op))
    calls = pd.DataFrame({"rank": host["rank"].to_numpy(), "op": call_op.to_numpy(),
                          "call_ns": host["ts_ns"].astype("int64").to_numpy()}).dropna()
    ops = pd.DataFrame({"rank": gloo["rank"].to_numpy(), "op": gloo_op.to_numpy(),
                        "ts_ns": issue.to_numpy(), "row": gloo.index}).dropna(subset=["op"])
    if calls.empty or ops.empty:
        return issue
    paired = pd.merge_asof(ops.sort_values("ts_ns"), calls.sort_values("call_ns"),
                           left_on="ts_ns", right_on="call_ns", by=["rank", "op"],
                           direction="backward")
    paired = paired.dropna(subset=["call_ns"]).drop_duplicates(["rank", "call_ns"], keep="first")
    issue.loc[paired["row"].to_numpy()] = paired["call_ns"].astype("int64").to_numpy()
    return issue


def _first_text(value):
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value
    if isinstance(parsed, list):
        return parsed[0] if parsed and isinstance(parsed[0], str) else None
    return parsed


def _steps_by_rank(ranks: np.ndarray, times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """steps.step_at for times of several ranks, each in its own rank's steps (rank, step,
    start_ns, end_ns): steps and times sorted by rank once, then one search per rank."""
    found = np.full(len(times), np.nan)
    step_rank, starts = steps["rank"].to_numpy(), steps["start_ns"].to_numpy()
    by_start = np.lexsort((starts, step_rank))
    step_rank, starts = step_rank[by_start], starts[by_start]
    ends = steps["end_ns"].to_numpy()[by_start]
    numbers = steps["step"].to_numpy("float64")[by_start]
    by_rank = np.argsort(ranks, kind="stable")
    distinct, first = np.unique(ranks[by_rank], return_index=True)
    for rank, rows in zip(distinct.tolist(), np.split(by_rank, first[1:])):
        own = slice(np.searchsorted(step_rank, rank), np.searchsorted(step_rank, rank, "right"))
        found[rows] = step_at(times[rows], starts[own], ends[own], numbers[own])
    return found


def _kineto_to_records(trace_steps: pd.DataFrame, record_steps: pd.DataFrame) -> int | None:
    """Kineto's clock minus the records' (time.time_ns) clock, from the steps both hold: a
    ProfilerStep#N span starts where step record N starts, up to the tracer's own step work
    (a few us). None where they hold no common step."""
    if trace_steps is None or record_steps is None or trace_steps.empty or record_steps.empty:
        return None
    both = trace_steps.merge(record_steps, on="step", suffixes=("_trace", "_records"))
    if both.empty:
        return None
    # The median in integers: the difference is ~1.7e18 ns, where float64 steps by 256 ns.
    differences = np.sort((both["start_ns_trace"] - both["start_ns_records"]).to_numpy("int64"))
    middle = len(differences) // 2
    if len(differences) % 2:
        return int(differences[middle])
    return int(differences[middle - 1]) + int(differences[middle] - differences[middle - 1]) // 2


class RankEvents(Mapping):
    """{rank: its host ops and the span of its events (analysis.rank.step_evidence.HostSpans) on
    the clock of its ops}, as its reduction found them: the straggler's evidence reads no
    event again."""

    def __init__(self, traces: dict):
        self._traces = traces  # {rank: (RankTrace, its Kineto clock minus its ops' clock)}

    def __getitem__(self, rank) -> HostSpans | None:
        trace, moved = self._traces[rank]
        spans = trace.table("host_spans")
        return None if spans is None else spans.moved(moved)

    def __iter__(self):
        return iter(self._traces)

    def __len__(self) -> int:
        return len(self._traces)


def _rank_comm(trace) -> pd.DataFrame:
    """The communication events of a rank's trace, as its reduction found them."""
    return trace.table("comm_events")


def _window_shows_unrecorded_all_reduce(trace, from_records: pd.DataFrame) -> bool:
    """The profiled window holds all-reduces (DDP's buckets) and the records none in its steps:
    a rank whose records hold every op it issued (a pipeline's p2p) keeps its records."""
    in_window = from_records["step"].isin(trace.steps["step"])
    if (in_window & (from_records["op"] == "all_reduce")).any():
        return False
    comm = _rank_comm(trace)
    if comm is None or not len(comm):
        return False
    ops = _by_value(comm["name"].astype(str), canonical_op)
    if "collective" in comm.columns:  # the op a kernel's record_param_comms names, where it has one
        of_collective = _by_value(comm["collective"], canonical_op)
        ops = of_collective.where(of_collective.notna(), ops)
    return bool((ops == "all_reduce").any())


def _untimed_in_window(from_records: pd.DataFrame, trace_steps: pd.DataFrame) -> bool:
    """Some of the rank's record ops timed at issue only fall in its profiled steps."""
    if trace_steps is None or not len(trace_steps):
        return False
    untimed = ~from_records["timed"].to_numpy(dtype=bool)
    return bool((untimed & from_records["step"].isin(trace_steps["step"]).to_numpy()).any())


def with_profiled_ends(records: pd.DataFrame, window: pd.DataFrame) -> pd.DataFrame:
    """One rank's record ops with the end of each op timed at issue only taken from the same op
    of its profiled steps (`window`: the rank's ops from its trace, on the records' clock), where
    analysis.rank.comm.profiled pairs them: `timed` then, `time_from` "profiled steps". An end
    is never before its own issue (the trace's clock is put on the records' within a few us)."""
    rows = pair_with_profiled(records, window.reset_index(drop=True))
    use = (rows >= 0) & ~records["timed"].to_numpy(dtype=bool)
    if not use.any():
        return records
    out = records.copy()
    issue = out["issue_ns"].to_numpy("int64")[use]
    out.loc[use, "end_ns"] = np.maximum(window["end_ns"].to_numpy("int64")[rows[use]], issue)
    out.loc[use, "timed"] = True
    out.loc[use, "time_from"] = FROM_PROFILED
    return out


def _step_arrays(steps: pd.DataFrame) -> dict:
    # Arrays, not a frame: selecting columns costs more per rank than the rank's few steps.
    return {column: steps[column].to_numpy() for column in ("step", "start_ns", "end_ns")}


def _stacked(parts: list[tuple], shifted: tuple) -> pd.DataFrame:
    """(frame or {column: array}, rank, shift) parts one after the other, each with a `rank`
    column and its `shifted` columns moved back by its shift: one concatenation, not a copy
    per rank."""
    if isinstance(parts[0][0], dict):
        frame = pd.DataFrame({column: np.concatenate([part[column] for part, _, _ in parts])
                              for column in parts[0][0]})
    else:
        frame = pd.concat([part for part, _, _ in parts], ignore_index=True)
    lengths = [len(part["step"]) if isinstance(part, dict) else len(part)
               for part, _, _ in parts]
    moved = np.repeat(np.array([shift for _, _, shift in parts], dtype=np.int64), lengths)
    if moved.any():
        for column in shifted:
            frame[column] = frame[column] - moved
    frame["rank"] = np.repeat(np.array([rank for _, rank, _ in parts], dtype=np.int64), lengths)
    return frame


def run_frames(run) -> dict:
    """{"ops", "steps", "clock_sync", "events", "world_size", "kineto_shift", "trace_ranks"} of a
    LoadResult (trace_ranks: the ranks whose ops come from their Kineto events alone);
    kineto_shift is, per rank, its Kineto clock minus the clock of its ops (0 where they stay on
    the trace's own clock)."""
    ops, steps, syncs, events, comm, trace_steps = [], [], [], {}, [], []
    trace_ranks = set()
    shifts = {}
    # Ranks whose records hold ops timed at issue only in profiled steps: {rank: the position of
    # its records' ops in `ops`}, and the comm events and steps of their traces.
    untimed_at, profiled, profiled_steps = {}, [], []
    for trace in run.ranks:
        if trace.rank == UNKNOWN_RANK:
            continue
        records = trace.records
        record_steps = records.steps if records is not None else None
        has_events = getattr(trace, "event_count", 0) > 0
        # Kineto's clock minus the records'; None where they share no step.
        shift = _kineto_to_records(trace.steps, record_steps) if has_events else None
        # Built only where there are records: an empty frame per rank costs more than its op.
        from_records = (ops_from_records(records.comms, trace.rank)
                        if records is not None and len(records.comms) else ())
        rank_steps = trace.steps
        # Records that lack DDP's bucket all-reduces (run in C++, recorded only with the
        # tracer's DDP bucket hook or the Flight Recorder) while the profiled window shows them:
        # the window's steps are read from its events, every op of them, the other steps from
        # the records; each step from one source, so no op counts twice.
        from_window = bool(len(from_records) and has_events and shift is not None
                           and windows_hold_what_records_lack(records) and len(trace.steps)
                           and _window_shows_unrecorded_all_reduce(trace, from_records))
        if from_window:
            from_records = from_records[~from_records["step"].isin(trace.steps["step"])]
        # Records without an op past set-up leave the rank to its Kineto events, put on the
        # records' clock where the two share a step, so that clock_sync applies to them too.
        if len(from_records) or from_window:
            if len(from_records):
                ops.append(from_records)
                if (has_events and shift is not None and not from_window
                        and _untimed_in_window(from_records, trace.steps)):
                    untimed_at[trace.rank] = len(ops) - 1
                    profiled.append((_rank_comm(trace), trace.rank, shift))
                    profiled_steps.append((_step_arrays(trace.steps), trace.rank, shift))
            if record_steps is not None and len(record_steps):
                rank_steps = record_steps[record_steps["step"] >= FIRST_TRAINING_STEP]
            if from_window:
                comm.append((_rank_comm(trace), trace.rank, shift))
                trace_steps.append((_step_arrays(trace.steps), trace.rank, shift))
        elif has_events:
            trace_ranks.add(trace.rank)
            moved = shift or 0
            comm.append((_rank_comm(trace), trace.rank, moved))
            rank_steps = trace.steps
            if len(rank_steps):
                trace_steps.append((_step_arrays(rank_steps), trace.rank, moved))
        if len(rank_steps):
            # A Kineto-only rank's steps, taken as arrays just above, are its steps here too.
            arrays = (trace_steps[-1][0] if trace.rank in trace_ranks
                      else _step_arrays(rank_steps))
            steps.append((arrays, trace.rank, moved if trace.rank in trace_ranks else 0))
        # clock_sync measures the records' clock (time.time_ns), not a trace's own.
        on_records_clock = len(from_records) > 0 or shift is not None
        for record in records.manifest if records is not None and on_records_clock else []:
            if isinstance(record, schema.ClockSync):
                syncs.append({"rank": trace.rank, "offset_ns": record.offset_ns,
                              "uncertainty_ns": record.uncertainty_ns})
        if has_events:
            # On the clock of the rank's ops: its records', or the trace's own.
            shifts[trace.rank] = moved = shift or 0
            events[trace.rank] = (trace, moved)
    if profiled:
        window = ops_from_events(_stacked(profiled, ("ts_ns", "end_ns")),
                                 _stacked(profiled_steps, ("start_ns", "end_ns")), run.world_size)
        for rank, at in untimed_at.items():
            ops[at] = with_profiled_ends(ops[at], window[window["rank"].to_numpy() == rank])
    if comm:
        ops.append(ops_from_events(_stacked(comm, ("ts_ns", "end_ns")),
                                   _stacked(trace_steps, ("start_ns", "end_ns")) if trace_steps
                                   else pd.DataFrame(columns=STEP_COLUMNS), run.world_size))
    sync = pd.DataFrame(syncs, columns=SYNC_COLUMNS).drop_duplicates("rank", keep="last")
    step_frame = (_stacked(steps, ("start_ns", "end_ns"))[STEP_COLUMNS] if steps
                  else pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_COLUMNS}))
    world = run.world_size or (max((t.rank for t in run.ranks if t.rank != UNKNOWN_RANK),
                                   default=-1) + 1)
    return {"ops": pd.concat(ops, ignore_index=True) if ops else empty_ops(),
            "steps": step_frame, "clock_sync": sync, "events": RankEvents(events),
            "world_size": world,
            "kineto_shift": shifts, "trace_ranks": frozenset(trace_ranks)}
