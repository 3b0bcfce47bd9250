"""Idle gaps summed by what the host was doing in them: the figures behind the device-idle
findings (analysis.findings.bottlenecks; docs/report.md).

Only the gaps of analysed (rank, step) rows with a positive duration count. A run of a thousand
ranks has millions of gaps: where ranks, steps and durations are integers (as idle_gaps makes
them) they are summed on arrays, exactly; anything else goes through pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ACTIVITY_COLUMNS = ["host_activity", "dur_ns", "gaps", "longest_ns", "longest_rank",
                    "longest_step"]
RANK_COLUMNS = ["host_activity", "rank", "dur_ns"]
_EXACT_FLOAT = 1 << 53  # integer sums below this are exact in a float64


def idle_by_activity(steps: pd.DataFrame, idle_gaps: pd.DataFrame
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per host activity, in sorted order: summed gap time, gap count, and the longest
    gap (the first of equals) with its rank and step; one row per activity and rank: its summed
    gap time, ranks in order) of the gaps of `idle_gaps` with a positive dur_ns in the (rank,
    step) rows of `steps`."""
    found = _on_arrays(steps, idle_gaps)
    if found is not None:
        return found
    gaps = idle_gaps[["rank", "step", "dur_ns", "host_activity"]].copy()
    for column in ("rank", "step", "dur_ns"):
        gaps[column] = pd.to_numeric(gaps[column], errors="coerce")
    return _on_frames(steps, gaps)


def _on_frames(steps: pd.DataFrame, gaps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    gaps = gaps.merge(steps[["rank", "step"]], on=["rank", "step"], how="inner")
    gaps = gaps[gaps["dur_ns"] > 0]
    rows, by_rank = [], []
    for activity, group in gaps.groupby("host_activity", sort=True):
        longest = group.loc[group["dur_ns"].idxmax()]
        rows.append((activity, group["dur_ns"].sum(), len(group), longest["dur_ns"],
                     longest["rank"], longest["step"]))
        per_rank = group.groupby("rank")["dur_ns"].sum()
        by_rank.append(pd.DataFrame({"host_activity": activity, "rank": per_rank.index,
                                     "dur_ns": per_rank.to_numpy()}))
    return (pd.DataFrame(rows, columns=ACTIVITY_COLUMNS),
            pd.concat(by_rank, ignore_index=True) if by_rank
            else pd.DataFrame(columns=RANK_COLUMNS))


def _on_arrays(steps: pd.DataFrame, gaps: pd.DataFrame
               ) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The same figures from integer arrays, or None where the gaps or steps are not plain
    non-negative integers with one row per (rank, step) in `steps` (pandas' rules then)."""
    if any(gaps[c].dtype != np.int64 for c in ("rank", "step", "dur_ns")):
        return None
    step_rank = steps["rank"].to_numpy(dtype=np.float64)
    step_step = steps["step"].to_numpy(dtype=np.float64)
    if (len(step_rank) == 0 or not np.isfinite(step_rank).all() or not np.isfinite(step_step).all()
            or (step_rank != np.floor(step_rank)).any() or (step_step != np.floor(step_step)).any()
            or step_rank.min() < 0 or step_step.min() < 0):
        return None
    rank, step, dur = (gaps[c].to_numpy() for c in ("rank", "step", "dur_ns"))
    if len(rank) and (rank.min() < 0 or step.min() < 0):
        return None
    width = int(max(step_step.max(), step.max(initial=0))) + 1
    top = int(max(step_rank.max(), rank.max(initial=0))) + 1
    if top * width >= _EXACT_FLOAT:
        return None
    step_keys = step_rank.astype(np.int64) * width + step_step.astype(np.int64)
    if len(np.unique(step_keys)) != len(step_keys):
        return None  # a (rank, step) twice: the merge would count its gaps twice
    keep = np.isin(rank * width + step, step_keys) & (dur > 0)
    codes, activities = pd.factorize(gaps["host_activity"], sort=True)
    # A gap with no activity is in no group, as in a groupby.
    keep &= codes >= 0
    codes, rank, step, dur = codes[keep], rank[keep], step[keep], dur[keep]
    if len(dur) and int(dur.sum()) >= _EXACT_FLOAT:
        return None
    kinds = len(activities)
    if kinds * top > 4 * len(dur) + (1 << 20):
        return None  # sparse rank numbers: a table per rank would be mostly empty
    # Sums as float64 bins: exact, every partial sum being an integer below 2**53 (checked).
    cells = codes.astype(np.int64) * top + rank
    per_rank = np.bincount(cells, weights=dur, minlength=kinds * top).reshape(kinds, top)
    present = np.bincount(cells, minlength=kinds * top).reshape(kinds, top) > 0
    totals = np.bincount(codes, weights=dur, minlength=kinds).astype(np.int64)
    rows, by_rank = [], []
    for code, name in enumerate(activities):
        members = np.flatnonzero(codes == code)
        if not len(members):
            continue  # only in gaps left out
        longest = members[np.argmax(dur[members])]
        rows.append((name, totals[code], len(members), dur[longest], rank[longest],
                     step[longest]))
        ranks = np.flatnonzero(present[code])
        by_rank.append(pd.DataFrame({"host_activity": name, "rank": ranks,
                                     "dur_ns": per_rank[code, ranks].astype(np.int64)}))
    return (pd.DataFrame(rows, columns=ACTIVITY_COLUMNS),
            pd.concat(by_rank, ignore_index=True) if by_rank
            else pd.DataFrame(columns=RANK_COLUMNS))
