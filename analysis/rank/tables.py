"""Per-rank and per-step tables: the time breakdown with memory, utilisation and rank spread.

Definitions in docs/report.md. Memory and utilisation come from the tracer's records
(analysis.rank.resource_use).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.model import known_rank
from analysis.rank.resource_use import RANK_RESOURCE_COLUMNS, rank_resources, step_resources
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS, COMM_SPLIT_COLUMNS

PER_STEP_INPUT_COLUMNS = ["rank", "step", *BREAKDOWN_NS_COLUMNS, "overlap_pct", "kind"]
STEP_EXTRA_COLUMNS = [
    "work_ns", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "rss_bytes",
    "sm_util_pct", "cpu_process_pct", "util_samples", "ranks_max_step_ns", "ranks_min_step_ns",
    "ranks_mean_step_ns", "slowest_rank", "imbalance_pct",
]
PER_STEP_COLUMNS = PER_STEP_INPUT_COLUMNS + STEP_EXTRA_COLUMNS
PER_RANK_COLUMNS = [
    "rank", "kind", "steps", "mean_step_ns", "median_step_ns", "min_step_ns", "max_step_ns",
    "compute_only_ns", "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns", "exposed_comm_ns",
    "work_ns", "idle_pct", "exposed_comm_pct", "peak_allocated_bytes", "peak_reserved_bytes",
    "device_total_bytes", "peak_reserved_pct", "peak_device_used_bytes", "device_used_pct",
    "peak_rss_bytes", "sm_util_pct", "cpu_process_pct", "slowdown_vs_fastest_pct", "slowest",
    "status",
]
_INT_COLUMNS = ("rank", "step", "slowest_rank", "util_samples", "steps")


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in columns})


def _dtype(column: str) -> str:
    if column in _INT_COLUMNS:
        return "Int64"
    if column in ("kind", "status"):
        return "object"
    if column == "slowest":
        return "bool"
    return "float64"


_FLOAT_INPUT_COLUMNS = (*BREAKDOWN_NS_COLUMNS, "overlap_pct", *COMM_SPLIT_COLUMNS)


def _clean_per_step(per_step) -> pd.DataFrame:
    """`per_step` with every input column (an absent one missing throughout), rank and step as
    Int64, the times and overlap_pct as float64 and the other columns as they are, on a fresh
    RangeIndex; built once from the columns (a reindex, copy and per-column assignment cost more
    than the table of a few steps)."""
    if not isinstance(per_step, pd.DataFrame) or per_step.empty:
        return _empty(PER_STEP_INPUT_COLUMNS)
    data = {}
    for column in dict.fromkeys([*PER_STEP_INPUT_COLUMNS, *per_step.columns]):
        values = (per_step[column] if column in per_step.columns
                  else pd.Series(np.nan, index=per_step.index))
        if column in ("rank", "step"):
            data[column] = _whole_numbers(values)
        elif column in _FLOAT_INPUT_COLUMNS:
            data[column] = _floats(values)
        else:
            data[column] = values.array.copy()
    return pd.DataFrame(data, index=pd.RangeIndex(len(per_step)))


# Numbers are read as pandas reads them (to_numeric: text that is none becomes missing); a
# column of numbers is taken as it is, the conversion (that would not change it) costing more
# than the table of a few steps.
def _whole_numbers(values: pd.Series):
    """The values as Int64, rounded."""
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iu":
        return pd.array(values.to_numpy(), dtype="Int64")
    return pd.to_numeric(values, errors="coerce").round().astype("Int64").array


def _floats(values: pd.Series) -> np.ndarray:
    """The values as a new float64 array, NaN where missing."""
    if not pd.api.types.is_numeric_dtype(values.dtype):
        values = pd.to_numeric(values, errors="coerce")
    return values.to_numpy(dtype="float64", na_value=np.nan, copy=True)


def work_ns(frame) -> np.ndarray:
    """Time the device did work of its own: compute alone, compute under comm, and copies, of
    each row of `frame` (a frame, or its columns by name); a missing part counts as 0, summed
    left to right (as pandas sums a row), NaN where all three are missing."""
    parts = [np.asarray(frame[c], dtype="float64")
             for c in ("compute_only_ns", "overlap_ns", "memcpy_ns")]
    missing = [np.isnan(p) for p in parts]
    total = np.where(missing[0], 0.0, parts[0])
    for part, absent in zip(parts[1:], missing[1:]):
        total = total + np.where(absent, 0.0, part)
    return np.where(missing[0] & missing[1] & missing[2], np.nan, total)


# ---- tables ------------------------------------------------------------------------------------
def per_step_table(per_step: pd.DataFrame, traces) -> pd.DataFrame:
    """breakdown_per_step rows with memory, utilisation and the spread of this step across ranks.

    work_ns = compute_only + overlap + memcpy. Memory peaks and utilisation are those of the
    tracer's record of the same (rank, step). ranks_*_step_ns, slowest_rank and imbalance_pct
    describe the step across all ranks that have it: imbalance_pct = (max - mean) / mean * 100
    of step_ns. Rows by step, then rank (missing ones last, ties in table order).

    Built from arrays, each added column read by position: merges and a sort cost more than the
    table of a few steps.
    """
    frame = _clean_per_step(per_step)
    if frame.empty:
        return _empty(PER_STEP_COLUMNS)
    order = _step_then_rank(frame)
    columns = {column: (values.to_numpy()[order] if isinstance(values.dtype, np.dtype)
                        else values.array.take(order)) for column, values in frame.items()}
    columns["work_ns"] = work_ns(frame)[order]
    resources = step_resources(traces)
    found = _record_rows(frame, resources)[order]
    for column in _STEP_RESOURCE_COLUMNS:
        # Position -1 (no record of the rank's step) reads the NaN appended last.
        columns[column] = np.append(resources[column].to_numpy(dtype="float64", na_value=np.nan),
                                    np.nan)[found]
    columns["util_samples"] = pd.array(columns["util_samples"], dtype="Int64")
    columns.update(_spread_at(frame, order))
    ordered = [*PER_STEP_COLUMNS, *[c for c in frame.columns if c not in PER_STEP_COLUMNS]]
    return pd.DataFrame({c: columns[c] for c in ordered}, index=pd.RangeIndex(len(frame)))


_STEP_RESOURCE_COLUMNS = ["peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                          "rss_bytes", "sm_util_pct", "cpu_process_pct", "util_samples"]
_SPREAD_COLUMNS = ["ranks_max_step_ns", "ranks_min_step_ns", "ranks_mean_step_ns",
                   "slowest_rank", "imbalance_pct"]


def _record_rows(frame: pd.DataFrame, records: pd.DataFrame) -> np.ndarray:
    """Each row's position among the records (distinct (rank, step) pairs, none missing) of its
    rank and step, -1 for none: each pair as one number, looked up by hashing."""
    ranks, steps = ([t[c].to_numpy(dtype="float64", na_value=np.nan) for t in (records, frame)]
                    for c in ("rank", "step"))
    every_step = np.concatenate(steps)
    low = np.nanmin(every_step) if np.isfinite(every_step).any() else 0.0
    width = np.nanmax(every_step) - low + 1 if np.isfinite(every_step).any() else 1.0
    # Ranks and steps are integers far below 2**53: the pair numbers are exact floats; a
    # missing rank or step gives NaN, found nowhere.
    keys = [rank * width + (step - low) for rank, step in zip(ranks, steps)]
    return pd.Index(keys[0]).get_indexer(keys[1])


def _step_then_rank(frame: pd.DataFrame) -> np.ndarray:
    """The rows' positions ordered as a stable sort by step, then rank, missing values last."""
    keys = []
    for column in ("rank", "step"):  # np.lexsort sorts by its last key first, stably
        values = frame[column]
        keys += [values.to_numpy(dtype="int64", na_value=0), values.isna().to_numpy()]
    return np.lexsort(keys)


def _spread_at(frame: pd.DataFrame, order: np.ndarray) -> dict:
    """The spread columns (_spread_arrays, over the rows with rank, step and step_ns known) of
    each row's step, for the rows at `order`: missing for a step without such rows."""
    steps = frame["step"].to_numpy(dtype="int64", na_value=0)
    ranks = frame["rank"].to_numpy(dtype="int64", na_value=0)
    step_ns = frame["step_ns"].to_numpy()
    known = frame["step"].notna().to_numpy()
    timed = known & frame["rank"].notna().to_numpy() & ~np.isnan(step_ns)
    spread = _spread_arrays(steps[timed], ranks[timed], step_ns[timed])
    wanted = steps[order]
    position = np.searchsorted(spread["step"], wanted)
    hit = known[order] & (position < spread["step"].size)
    hit[hit] = spread["step"][position[hit]] == wanted[hit]
    at = np.where(hit, position, -1)  # -1: the missing value appended last
    found = {}
    for column in _SPREAD_COLUMNS:
        if column == "slowest_rank":
            found[column] = pd.array(spread[column], dtype="Int64").take(at, allow_fill=True)
        else:
            found[column] = np.append(spread[column], np.nan)[at]
    return found


def _spread_arrays(steps: np.ndarray, ranks: np.ndarray, step_ns: np.ndarray) -> dict:
    """Per distinct step, ascending: the max, min and mean step_ns over its ranks, the slowest
    rank (the first of equals; NA for a step of one rank) and imbalance_pct. Read as slices of
    arrays sorted by step (stable, so ties keep table order): pandas' per-group Series calls
    cost most of the per-step table. Each value is what the Series reduction gives on the same
    values."""
    order = np.argsort(steps, kind="stable")
    steps, step_ns, ranks = steps[order], step_ns[order], ranks[order]
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if steps.size else steps
    ends = np.r_[starts[1:], steps.size]
    found = {c: [] for c in _SPREAD_COLUMNS}
    for start, end in zip(starts.tolist(), ends.tolist()):
        values = step_ns[start:end]
        mean = values.sum() / values.size
        most = values.max()
        found["ranks_max_step_ns"].append(most)
        found["ranks_min_step_ns"].append(values.min())
        found["ranks_mean_step_ns"].append(mean)
        found["slowest_rank"].append(int(ranks[start + int(values.argmax())])
                                     if values.size > 1 else pd.NA)
        found["imbalance_pct"].append((most - mean) / mean * 100 if mean > 0 else np.nan)
    result = {c: np.array(v, dtype=object if c == "slowest_rank" else "float64")
              for c, v in found.items()}
    result["step"] = steps[starts] if steps.size else steps
    return result


def _nan_mean(values: np.ndarray) -> float:
    """Series.mean's value: the sum with NaN as 0, over the count of the others."""
    missing = np.isnan(values)
    count = values.size - int(missing.sum())
    return np.where(missing, 0.0, values).sum() / count if count else np.nan


def _rank_step_rows(frame: pd.DataFrame) -> list[dict]:
    """Per rank: the step-time statistics and breakdown means of per_rank_table.

    The rows are sorted by rank once and each rank's values read as a slice of numpy arrays:
    pandas' per-group Series calls cost seconds at a thousand ranks. Each value is what the
    Series reduction gives on the same values in the same order (pandas sums with numpy, NaN
    as 0), so the table is unchanged.
    """
    ranked = frame.dropna(subset=["rank"])
    if ranked.empty:
        return []
    order = np.argsort(ranked["rank"].to_numpy(dtype="int64"), kind="stable")
    ranks = ranked["rank"].to_numpy(dtype="int64")[order]
    starts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
    ends = np.r_[starts[1:], ranks.size]
    split = [c for c in COMM_SPLIT_COLUMNS if c in ranked.columns]
    numbers = {c: ranked[c].to_numpy(dtype="float64", na_value=np.nan)[order]
               for c in [*BREAKDOWN_NS_COLUMNS, "work_ns", "step", *split]}
    kinds = ranked["kind"].astype(object).to_numpy()[order]
    rows = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        step_ns = numbers["step_ns"][start:end]
        step_ns = step_ns[~np.isnan(step_ns)]
        total_ns = step_ns.sum()
        steps = numbers["step"][start:end]
        row = {
            "rank": int(ranks[start]),
            "kind": _mode(kinds[start:end]),
            "steps": int(np.unique(steps[~np.isnan(steps)]).size),
            "mean_step_ns": total_ns / step_ns.size if step_ns.size else np.nan,
            "median_step_ns": np.median(step_ns) if step_ns.size else np.nan,
            "min_step_ns": step_ns.min() if step_ns.size else np.nan,
            "max_step_ns": step_ns.max() if step_ns.size else np.nan,
        }
        for column in [*BREAKDOWN_NS_COLUMNS[1:], "work_ns", *split]:
            row[column] = _nan_mean(numbers[column][start:end])
        for column, share in (("idle_ns", "idle_pct"), ("exposed_comm_ns", "exposed_comm_pct")):
            # A share of the steps that have the part: the profiled ones of the analysed steps.
            values = numbers[column][start:end]
            known = ~np.isnan(values)
            whole = numbers["step_ns"][start:end][known]
            whole = whole[~np.isnan(whole)].sum()
            part = values[known].sum()
            row[share] = part / whole * 100 if whole > 0 else np.nan
        rows.append(row)
    return rows


def _mode(values: np.ndarray):
    """The most frequent of the known values (the smallest of equally frequent ones), or None."""
    counts: dict = {}
    for value in values:
        if not pd.isna(value):
            counts[value] = counts.get(value, 0) + 1
    if not counts:
        return None
    most = max(counts.values())
    return min(v for v, n in counts.items() if n == most)


def per_rank_table(per_step: pd.DataFrame, traces) -> pd.DataFrame:
    """One row per rank: step-time statistics and breakdown means over the analysed steps,
    memory peaks and mean utilisation over all the steps the tracer recorded, and how much
    slower the rank's mean step is than the fastest rank's. A rank analysed but without steps
    (no trace, or no step marked) still gets its row.
    """
    frame = _clean_per_step(per_step)
    resources = rank_resources(traces)
    if frame.empty and resources.empty:
        return _empty(PER_RANK_COLUMNS)
    frame["work_ns"] = work_ns(frame)
    stepped = {row["rank"]: row for row in _rank_step_rows(frame)}
    recorded = {int(row["rank"]): row for row in resources.to_dict("records")}
    listed = [int(t.rank) for t in traces or [] if known_rank(t) is not None]
    split = [c for c in COMM_SPLIT_COLUMNS if c in frame.columns]
    table = pd.DataFrame([{**recorded.get(rank, {}), **stepped.get(rank, {}), "rank": rank}
                          for rank in sorted({*stepped, *recorded, *listed})],
                         columns=[*_STEP_ROW_COLUMNS, *RANK_RESOURCE_COLUMNS[1:], *split])
    if table["kind"].dtype == np.float64:  # no rank has steps: no kind was given
        table["kind"] = table["kind"].astype(object)
    return _finished_per_rank(table, traces)


# The columns of _rank_step_rows' rows.
_STEP_ROW_COLUMNS = [c for c in PER_RANK_COLUMNS if c not in RANK_RESOURCE_COLUMNS or c == "rank"]


def _finished_per_rank(table: pd.DataFrame, traces) -> pd.DataFrame:
    """per_rank_table's shares, slowdown, types and status on the rows joined to resources."""
    table["peak_reserved_pct"] = table["peak_reserved_bytes"] / table["device_total_bytes"] * 100
    table["device_used_pct"] = (table["peak_device_used_bytes"]
                                / table["device_used_total_bytes"] * 100)
    means = pd.to_numeric(table["mean_step_ns"], errors="coerce")
    fastest = means[means > 0].min() if (means > 0).any() else np.nan
    table["slowdown_vs_fastest_pct"] = (means - fastest) / fastest * 100
    slowest_value = means.max()
    table["slowest"] = (means == slowest_value) & (means.notna().sum() > 1)
    # The split of communication (mean ns per step) after comm_only_ns, where it is known.
    split = [c for c in COMM_SPLIT_COLUMNS if c in table.columns]
    at = PER_RANK_COLUMNS.index("comm_only_ns") + 1
    table = table.reindex(columns=[*PER_RANK_COLUMNS[:at], *split, *PER_RANK_COLUMNS[at:]])
    for column in split:
        table[column] = pd.to_numeric(table[column], errors="coerce").astype("float64")
    for column in PER_RANK_COLUMNS:
        dtype = _dtype(column)
        if dtype in ("Int64", "float64") and str(table[column].dtype) != dtype:
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(dtype)
    table["slowest"] = table["slowest"].fillna(False).astype(bool)
    table["steps"] = table["steps"].fillna(0).astype("Int64")
    status = {int(t.rank): t.status for t in traces or []
              if known_rank(t) is not None and getattr(t, "status", None)}
    table["status"] = pd.Series([status.get(int(r)) if not pd.isna(r) else None
                                 for r in table["rank"]], index=table.index, dtype=object)
    return table.sort_values("rank", kind="stable").reset_index(drop=True)


def slowest_and_fastest(per_rank: pd.DataFrame, slowest: int, fastest: int) -> dict:
    """The ranks a short rank table shows when it cannot show them all: the `slowest` ranks by
    mean step (slowest first), the `fastest` ones (slowest of them first), and what is left
    between them, as {"slowest": [rank...], "fastest": [rank...], "rest": count of the others,
    "rest_min_ns", "rest_max_ns": the others' range of mean step, None where none has one}.
    A rank without a mean step sorts after every timed one, among the rest."""
    means = pd.to_numeric(per_rank["mean_step_ns"], errors="coerce")
    order = per_rank.assign(_mean=means).sort_values(
        ["_mean", "rank"], ascending=[False, True], kind="stable", na_position="last")
    timed = order[order["_mean"].notna()]
    top = list(timed["rank"].head(slowest))
    bottom = [r for r in timed["rank"].tail(fastest) if r not in top]
    rest = order[~order["rank"].isin([*top, *bottom])]
    rest_means = rest["_mean"].dropna()
    return {"slowest": [int(r) for r in top], "fastest": [int(r) for r in bottom],
            "rest": len(rest),
            "rest_min_ns": float(rest_means.min()) if len(rest_means) else None,
            "rest_max_ns": float(rest_means.max()) if len(rest_means) else None}
