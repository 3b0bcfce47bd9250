"""Per-rank and per-step tables: the time breakdown with memory, utilisation and rank spread.

Definitions in docs/report.md. Memory and utilisation come from the tracer's records
(analysis.rank.resources).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.rank.resources import (
    RANK_RESOURCE_COLUMNS,
    keyed,
    rank_resources,
    records_by_rank,
    step_resources,
)
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS

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


def _clean_per_step(per_step) -> pd.DataFrame:
    if not isinstance(per_step, pd.DataFrame) or per_step.empty:
        return _empty(PER_STEP_INPUT_COLUMNS)
    plain = _plain_per_step(per_step)
    if plain is not None:
        return plain
    columns = list(dict.fromkeys([*PER_STEP_INPUT_COLUMNS, *per_step.columns]))
    frame = per_step.reindex(columns=columns)
    frame = keyed(frame.copy())
    for column in [*BREAKDOWN_NS_COLUMNS, "overlap_pct"]:
        if str(frame[column].dtype) != "float64":
            frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    return frame.reset_index(drop=True)


_FLOAT_INPUT_COLUMNS = (*BREAKDOWN_NS_COLUMNS, "overlap_pct")


def _plain_per_step(per_step: pd.DataFrame) -> pd.DataFrame | None:
    """_clean_per_step's frame built in one call where it is breakdown_per_step's own (int64
    rank and step, integer or float64 times): the reindex, copy and per-column conversions cost
    more than the table of a few steps. None for anything else. An int64 value converts to
    the same float64, and rounds to itself, either way."""
    if any(c not in per_step.columns for c in PER_STEP_INPUT_COLUMNS) \
            or not per_step.columns.is_unique:
        return None
    dtypes = per_step.dtypes
    if dtypes["rank"] != np.int64 or dtypes["step"] != np.int64 or any(
            dtypes[c] not in (np.int64, np.float64) for c in _FLOAT_INPUT_COLUMNS):
        return None
    columns = list(dict.fromkeys([*PER_STEP_INPUT_COLUMNS, *per_step.columns]))
    data = {}
    for column in columns:
        values = per_step[column]
        if column in ("rank", "step"):
            data[column] = pd.array(values.to_numpy(), dtype="Int64")
        elif column in _FLOAT_INPUT_COLUMNS:
            data[column] = values.to_numpy(dtype="float64", copy=True)
        else:
            data[column] = values.array.copy()
    return pd.DataFrame(data, index=pd.RangeIndex(len(per_step)))


def work_ns(frame: pd.DataFrame) -> pd.Series:
    """Time the device did work of its own: compute alone, compute under comm, and copies."""
    parts = frame[["compute_only_ns", "overlap_ns", "memcpy_ns"]]
    return parts.sum(axis=1, min_count=1)


# ---- tables ------------------------------------------------------------------------------------
def per_step_table(per_step: pd.DataFrame, traces) -> pd.DataFrame:
    """breakdown_per_step rows with memory, utilisation and the spread of this step across ranks.

    work_ns = compute_only + overlap + memcpy. Memory peaks and utilisation are those of the
    tracer's record of the same (rank, step). ranks_*_step_ns, slowest_rank and imbalance_pct
    describe the step across all ranks that have it: imbalance_pct = (max - mean) / mean * 100
    of step_ns.
    """
    frame = _clean_per_step(per_step)
    if frame.empty:
        return _empty(PER_STEP_COLUMNS)
    if _without_resources(frame, traces):
        return _bare_per_step_table(frame)
    frame["work_ns"] = work_ns(frame)
    resources = step_resources(traces)
    frame = frame.merge(resources, on=["rank", "step"], how="left")
    spread = _step_spread(frame)
    frame = frame.merge(spread, on="step", how="left")
    ordered = [*PER_STEP_COLUMNS, *[c for c in frame.columns if c not in PER_STEP_COLUMNS]]
    frame = frame.reindex(columns=ordered)
    for column in STEP_EXTRA_COLUMNS:
        dtype = _dtype(column)
        if dtype != "object" and str(frame[column].dtype) != dtype:
            frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(dtype)
    return frame.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


# The columns per_step_table adds to the cleaned per-step frame after work_ns.
_ADDED_STEP_COLUMNS = set(STEP_EXTRA_COLUMNS) - {"work_ns"}
_STEP_RESOURCE_COLUMNS = ["peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                          "rss_bytes", "sm_util_pct", "cpu_process_pct", "util_samples"]
_SPREAD_COLUMNS = ["ranks_max_step_ns", "ranks_min_step_ns", "ranks_mean_step_ns",
                   "slowest_rank", "imbalance_pct"]


def _without_resources(frame: pd.DataFrame, traces) -> bool:
    """Whether per_step_table can skip its merges: no tracer records (every resource column
    missing), rank and step known on every row, and none of the added columns already there
    (the merges would suffix them)."""
    return (not records_by_rank(traces) and not _ADDED_STEP_COLUMNS & set(frame.columns)
            and not frame["rank"].hasnans and not frame["step"].hasnans)


def _bare_per_step_table(frame: pd.DataFrame) -> pd.DataFrame:
    """per_step_table without tracer records, from arrays: the resource columns missing, each
    step's spread read by its rows' position among the steps, the rows ordered as the stable
    sort by (step, rank) orders them. The merges, conversions and sort cost more than the
    table of a few steps."""
    steps = frame["step"].to_numpy(dtype="int64")
    ranks = frame["rank"].to_numpy(dtype="int64")
    step_ns = frame["step_ns"].to_numpy(dtype="float64")
    order = np.lexsort((ranks, steps))
    rows = len(frame)
    data = {column: (values.to_numpy()[order] if isinstance(values.dtype, np.dtype)
                     else values.array.take(order))
            for column, values in frame.items()}
    data["work_ns"] = _work_ns_values(frame)[order]
    for column in _STEP_RESOURCE_COLUMNS:
        data[column] = (pd.array([pd.NA] * rows, dtype="Int64") if column == "util_samples"
                        else np.full(rows, np.nan))
    timed = ~np.isnan(step_ns)
    spread = _spread_arrays(steps[timed], ranks[timed], step_ns[timed])
    position = np.searchsorted(spread["step"], steps[order])
    found = position < spread["step"].size
    found[found] = spread["step"][position[found]] == steps[order][found]
    for column in _SPREAD_COLUMNS:
        values = spread[column]
        if column == "slowest_rank":
            data[column] = pd.array(
                [values[p] if hit else pd.NA for p, hit in zip(position.tolist(), found)],
                dtype="Int64")
        else:
            data[column] = np.where(found, values[np.minimum(position, values.size - 1)]
                                    if values.size else np.nan, np.nan)
    ordered = [*PER_STEP_COLUMNS, *[c for c in frame.columns if c not in PER_STEP_COLUMNS]]
    return pd.DataFrame({c: data[c] for c in ordered}, index=pd.RangeIndex(rows))


def _work_ns_values(frame: pd.DataFrame) -> np.ndarray:
    """work_ns(frame) of float64 columns as an array: the sum with NaN as 0, in column order
    (as pandas sums a row), NaN where all three are missing."""
    parts = [frame[c].to_numpy(dtype="float64") for c in ("compute_only_ns", "overlap_ns",
                                                          "memcpy_ns")]
    missing = [np.isnan(p) for p in parts]
    total = np.where(missing[0], 0.0, parts[0])
    for part, absent in zip(parts[1:], missing[1:]):
        total = total + np.where(absent, 0.0, part)
    return np.where(missing[0] & missing[1] & missing[2], np.nan, total)


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


def _step_spread(frame: pd.DataFrame) -> pd.DataFrame:
    """Per step: the max, min and mean step_ns over its ranks, the slowest rank (the first of
    equals; NA for a step of one rank) and imbalance_pct (_spread_arrays)."""
    timed = frame.dropna(subset=["step", "rank", "step_ns"])
    found = _spread_arrays(timed["step"].to_numpy(dtype="int64"),
                           timed["rank"].to_numpy(dtype="int64"),
                           timed["step_ns"].to_numpy(dtype="float64"))
    columns = ["step", *_SPREAD_COLUMNS]
    spread = (pd.DataFrame({c: found[c] for c in columns}) if found["step"].size
              else pd.DataFrame([], columns=columns))
    spread["step"] = spread["step"].astype("Int64")
    return spread


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
    numbers = {c: ranked[c].to_numpy(dtype="float64", na_value=np.nan)[order]
               for c in [*BREAKDOWN_NS_COLUMNS, "work_ns", "step"]}
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
        for column in [*BREAKDOWN_NS_COLUMNS[1:], "work_ns"]:
            row[column] = _nan_mean(numbers[column][start:end])
        for column, share in (("idle_ns", "idle_pct"), ("exposed_comm_ns", "exposed_comm_pct")):
            values = numbers[column][start:end]
            part = np.where(np.isnan(values), 0.0, values).sum()
            row[share] = part / total_ns * 100 if total_ns > 0 else np.nan
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
    slower the rank's mean step is than the fastest rank's.
    """
    frame = _clean_per_step(per_step)
    listed = [int(t.rank) for t in traces or [] if getattr(t, "rank", None) is not None]
    if _rows_cover(frame, listed) and not records_by_rank(traces):
        # No tracer records, every listed rank has steps: the outer merge with the typed empty
        # resources would only add their columns, missing, to rows already in rank order.
        frame["work_ns"] = _work_ns_values(frame)
        table = pd.DataFrame(_rank_step_rows(frame), columns=[
            c for c in PER_RANK_COLUMNS if c not in RANK_RESOURCE_COLUMNS or c == "rank"])
        table["rank"] = table["rank"].astype("Int64")
        for column in RANK_RESOURCE_COLUMNS[1:]:
            table[column] = np.nan
        return _finished_per_rank(table, traces)
    resources = rank_resources(traces)
    if frame.empty and resources.empty:
        return _empty(PER_RANK_COLUMNS)
    # A rank analysed but without steps (no trace, or no step marked) still gets its row.
    missing = sorted(set(listed) - set(resources["rank"].dropna().astype(int)))
    if missing:
        resources = pd.concat([resources, pd.DataFrame({"rank": pd.array(missing, "Int64")})],
                              ignore_index=True)
    rows = _rank_step_rows(frame.assign(work_ns=work_ns(frame)))
    table = pd.DataFrame(rows, columns=[c for c in PER_RANK_COLUMNS
                                        if c not in resources.columns or c == "rank"])
    table["rank"] = table["rank"].astype("Int64")
    return _finished_per_rank(table.merge(resources, on="rank", how="outer"), traces)


def _rows_cover(frame: pd.DataFrame, listed: list[int]) -> bool:
    """Whether the cleaned per-step frame has float64 times, a known rank on every row and
    every listed rank among them."""
    return (not frame.empty and not frame["rank"].hasnans
            and all(frame[c].dtype == np.float64 for c in
                    ("compute_only_ns", "overlap_ns", "memcpy_ns"))
            and set(listed) <= set(frame["rank"].to_numpy(dtype="int64").tolist()))


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
    table = table.reindex(columns=PER_RANK_COLUMNS)
    for column in PER_RANK_COLUMNS:
        dtype = _dtype(column)
        if dtype in ("Int64", "float64") and str(table[column].dtype) != dtype:
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(dtype)
    table["slowest"] = table["slowest"].fillna(False).astype(bool)
    table["steps"] = table["steps"].fillna(0).astype("Int64")
    status = {int(t.rank): t.status for t in traces or []
              if getattr(t, "rank", None) is not None and getattr(t, "status", None)}
    table["status"] = pd.Series([status.get(int(r)) if not pd.isna(r) else None
                                 for r in table["rank"]], index=table.index, dtype=object)
    return table.sort_values("rank", kind="stable").reset_index(drop=True)
