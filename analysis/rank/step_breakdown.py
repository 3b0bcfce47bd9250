"""Where each step's time goes, per rank: compute, communication, their overlap, copies, idle.

Pure functions from a RankTrace to DataFrames; every definition used here is written once in
docs/definitions.md. The moments of a step are classified by analysis.rank.layers, idle gaps by
analysis.rank.idle and the HTA-compatible columns by analysis.rank.hta.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.model import RankTrace, known_rank
from analysis.core.steps import FIRST_TRAINING_STEP
from analysis.rank.layers import PARTS, trace_kind, trace_layers, window_bounds

# The time columns of a step (or a rank's steps): its length, the five PARTS that add up to it,
# and exposed communication. analysis.rank.tables and analysis.findings.bottlenecks use the same
# list.
BREAKDOWN_NS_COLUMNS = ["step_ns", *PARTS, "exposed_comm_ns"]
# breakdown_per_step's frame.
BREAKDOWN_COLUMNS = ["rank", "step", *BREAKDOWN_NS_COLUMNS, "overlap_pct", "kind",
                     "start_ns", "end_ns"]
# rank_totals' frame.
TOTALS_COLUMNS = ["rank", "steps", *BREAKDOWN_NS_COLUMNS, "overlap_pct", "kind"]
# The communication-only time split into transfer and waiting for peers, added to the per-step
# frame once the cross-rank waits are known (analysis.run; docs/definitions.md, "Waiting for
# peers"); summed and averaged with the other parts where present.
COMM_SPLIT_COLUMNS = ["transfer_ns", "peer_wait_ns"]


def empty_breakdown() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in BREAKDOWN_COLUMNS})
    frame["rank"] = frame["rank"].astype(object)
    frame["overlap_pct"] = frame["overlap_pct"].astype("float64")
    frame["kind"] = frame["kind"].astype(object)
    return frame


def breakdown_per_step(trace: RankTrace, kind_layers: tuple | None = None) -> pd.DataFrame:
    """One row per step: its time split into compute only, communication only, overlap,
    memory copy/set and idle (these five add up to step_ns exactly), plus exposed communication
    and the share of communication hidden by compute. `kind_layers`: (trace_kind,
    trace_layers) of the trace, where the caller has them."""
    steps, starts, ends = window_bounds(trace)
    if steps.size == 0:
        return empty_breakdown()
    kind, (layers, category) = kind_layers or kind_and_layers(trace)
    by_state = intervals.state_durations(layers, starts, ends)
    parts = np.zeros((steps.size, len(PARTS)), dtype=np.int64)
    for state, part in enumerate(category):
        parts[:, part] += by_state[:, state]
    # One frame built in BREAKDOWN_COLUMNS' order: inserting column by column costs more.
    columns = {"rank": known_rank(trace), "step": steps, "step_ns": ends - starts}
    columns.update(zip(PARTS, parts.T))
    comm_only = columns["comm_only_ns"]
    columns["exposed_comm_ns"] = comm_only
    columns["overlap_pct"] = overlap_pct(columns["overlap_ns"], comm_only)
    columns.update(kind=kind, start_ns=starts, end_ns=ends)
    return pd.DataFrame(columns)


def kind_and_layers(trace: RankTrace) -> tuple:
    """(trace_kind, trace_layers) of the trace: what breakdown_per_step and idle_gaps share."""
    kind = trace_kind(trace)
    return kind, trace_layers(trace, kind)


def overlap_pct(overlap_ns, comm_only_ns):
    """Percentage of communication time during which compute also ran (NaN without comm)."""
    overlap_ns = np.asarray(overlap_ns, dtype=np.float64)
    comm = overlap_ns + np.asarray(comm_only_ns, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(comm > 0, 100.0 * overlap_ns / np.where(comm > 0, comm, 1.0), np.nan)


def rank_totals(per_step: pd.DataFrame) -> pd.DataFrame:
    """The per-step breakdown summed over each rank's steps (overlap_pct from the sums): ranks in
    order of first appearance, rows without a rank together as one; each rank's first known
    kind. Summed on arrays: a groupby costs milliseconds on the few rows of a run."""
    if per_step.empty:
        return empty_breakdown().drop(columns=["step", "start_ns", "end_ns"]).assign(steps=0)
    group, _ = pd.factorize(per_step["rank"], use_na_sentinel=False)
    groups = int(group.max()) + 1
    by_group = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[by_group], np.arange(groups))
    columns = {"rank": per_step["rank"].array.take(by_group[bounds]),
               "steps": np.bincount(group, minlength=groups).astype(np.int64)}
    for column in BREAKDOWN_NS_COLUMNS:
        values = per_step[column].to_numpy()
        if values.dtype.kind == "f":
            values = np.where(np.isnan(values), 0.0, values)  # as a sum leaves NaN out
        columns[column] = np.add.reduceat(values[by_group], bounds).astype(np.int64)
    columns["overlap_pct"] = overlap_pct(columns["overlap_ns"], columns["comm_only_ns"])
    columns["kind"] = _first_known(per_step["kind"], group, groups)
    for column in COMM_SPLIT_COLUMNS:
        if column in per_step.columns:  # NaN for a rank none of whose steps has it
            values = per_step[column].to_numpy("float64")[by_group]
            known = np.add.reduceat((~np.isnan(values)).astype(np.int64), bounds)
            sums = np.add.reduceat(np.where(np.isnan(values), 0.0, values), bounds)
            columns[column] = np.where(known > 0, sums, np.nan)
    return pd.DataFrame(columns)


def _first_known(kind: pd.Series, group: np.ndarray, groups: int):
    """Each group's first kind that is not missing (missing where it has none)."""
    known = np.flatnonzero(kind.notna().to_numpy())
    found, first = np.unique(group[known], return_index=True)
    rows = np.full(groups, -1, dtype=np.intp)
    rows[found] = known[first]
    return kind.array.take(rows, allow_fill=True)


def record_step_rows(traces, per_step: pd.DataFrame, steps: list[int] | None) -> pd.DataFrame:
    """Breakdown rows of the analysed steps that no profiler window holds: each rank's recorded
    steps (from the first step, those of --steps) that `per_step` lacks, with step_ns, start_ns
    and end_ns from the tracer's step record and every part of the kernel-level split missing
    (docs/definitions.md, "Analysed steps"). The kind is the rank's profiled kind."""
    profiled_rank = pd.to_numeric(per_step["rank"], errors="coerce")
    profiled_step = pd.to_numeric(per_step["step"], errors="coerce")
    kinds = dict(zip(profiled_rank.tolist(), per_step["kind"].tolist()))
    frames = []
    for trace in traces:
        records = trace.records
        recorded = getattr(records, "steps", None) if records is not None else None
        rank = known_rank(trace)
        if rank is None or recorded is None or not len(recorded):
            continue
        if not {"step", "start_ns", "end_ns"} <= set(recorded.columns):
            continue
        numbers = recorded[["step", "start_ns", "end_ns"]].apply(pd.to_numeric, errors="coerce")
        numbers = numbers.dropna().drop_duplicates("step", keep="last")
        kept = ((numbers["step"] >= FIRST_TRAINING_STEP)
                & (numbers["end_ns"] > numbers["start_ns"])
                & ~numbers["step"].isin(profiled_step[profiled_rank == rank]))
        if steps is not None:
            kept &= numbers["step"].isin(steps)
        numbers = numbers[kept].astype("int64")
        frames.append(pd.DataFrame({
            "rank": int(rank), "step": numbers["step"],
            "step_ns": numbers["end_ns"] - numbers["start_ns"],
            "kind": kinds.get(float(rank)), "start_ns": numbers["start_ns"],
            "end_ns": numbers["end_ns"]}))
    columns = ["rank", "step", "step_ns", "kind", "start_ns", "end_ns"]
    frame = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=columns))
    return frame.reindex(columns=list(dict.fromkeys([*per_step.columns, *columns])))
