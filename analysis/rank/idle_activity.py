"""Idle gaps summed by what the host was doing in them: the figures behind the device-idle
findings (analysis.findings.bottlenecks; docs/report.md).

Only the gaps of analysed (rank, step) rows with a positive duration count. A run of a thousand
ranks has millions of gaps: they are grouped by integer codes and summed on arrays (exactly, in
the durations' own type), not by a join and a groupby per activity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ACTIVITY_COLUMNS = ["host_activity", "dur_ns", "gaps", "longest_ns", "longest_rank",
                    "longest_step"]
RANK_COLUMNS = ["host_activity", "rank", "dur_ns"]


def idle_by_activity(steps: pd.DataFrame, idle_gaps: pd.DataFrame
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per host activity, in sorted order: summed gap time, gap count, and the longest
    gap (the first of equals) with its rank and step; one row per activity and rank: its summed
    gap time, ranks in order) of the gaps of `idle_gaps` with a positive dur_ns in the (rank,
    step) rows of `steps`. A (rank, step) listed twice in `steps` counts its gaps twice, as a
    join would; a gap without a rank, step or activity counts in none."""
    # Numbers as pandas reads them (text that is none: NaN), int64 kept: its sums stay exact.
    rank, step, dur = (pd.to_numeric(idle_gaps[c], errors="coerce").to_numpy()
                       for c in ("rank", "step", "dur_ns"))
    times = _times_listed(rank, step, steps)
    codes, activities = pd.factorize(idle_gaps["host_activity"], sort=True)
    kept = np.flatnonzero((times > 0) & (dur > 0) & (codes >= 0))
    kept = np.repeat(kept, times[kept])
    codes, rank, step, dur = codes[kept], rank[kept], step[kept], dur[kept]
    rank_codes, ranks = pd.factorize(rank, sort=True)
    kinds, width = len(activities), len(ranks)
    cells = codes.astype(np.int64) * width + rank_codes
    per_rank = np.zeros(kinds * width, dtype=dur.dtype)
    np.add.at(per_rank, cells, dur)
    present = np.bincount(cells, minlength=kinds * width).reshape(kinds, width) > 0
    per_rank = per_rank.reshape(kinds, width)
    counts = np.bincount(codes, minlength=kinds)
    longest = _first_longest(codes, dur, kinds)
    rows, by_rank = [], []
    for code in np.flatnonzero(counts).tolist():  # an activity only in gaps left out: no row
        first = longest[code]
        rows.append((activities[code], per_rank[code].sum(), int(counts[code]), dur[first],
                     rank[first], step[first]))
        held = np.flatnonzero(present[code])
        by_rank.append(pd.DataFrame({"host_activity": activities[code], "rank": ranks[held],
                                     "dur_ns": per_rank[code, held]}))
    return (pd.DataFrame(rows, columns=ACTIVITY_COLUMNS),
            pd.concat(by_rank, ignore_index=True) if by_rank
            else pd.DataFrame(columns=RANK_COLUMNS))


def _times_listed(rank: np.ndarray, step: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """How many rows of `steps` have each gap's (rank, step) (0 for a missing one): looked up
    by hashing, first each number among the listed ranks and steps, then the pair."""
    listed = [steps[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in ("rank", "step")]
    known = ~np.isnan(listed[0]) & ~np.isnan(listed[1])
    listed = [values[known] for values in listed]
    codes = []  # (listed rows' codes, gaps' codes; -1 for a number no listed row has)
    for values, gaps in zip(listed, (rank, step)):
        numbers = pd.Index(np.unique(values))
        codes.append((numbers.get_indexer(values), numbers.get_indexer(gaps.astype(np.float64))))
    (listed_rank, gap_rank), (listed_step, gap_step) = codes
    width = int(listed_step.max(initial=0)) + 1
    pairs, counts = np.unique(listed_rank * width + listed_step, return_counts=True)
    known = (gap_rank >= 0) & (gap_step >= 0)
    at = pd.Index(pairs).get_indexer(np.where(known, gap_rank * width + gap_step, -1))
    return np.append(counts, 0)[at]  # -1 (not listed) reads the 0 appended last


def _first_longest(codes: np.ndarray, dur: np.ndarray, kinds: int) -> np.ndarray:
    """Per code, the position of its first gap of the largest duration (durations positive)."""
    most = np.zeros(kinds, dtype=dur.dtype)
    np.maximum.at(most, codes, dur)
    longest = np.flatnonzero(dur == most[codes])
    found, first = np.unique(codes[longest], return_index=True)
    positions = np.zeros(kinds, dtype=np.intp)
    positions[found] = longest[first]
    return positions
