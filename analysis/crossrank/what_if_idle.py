"""What-if answers of idle gaps (docs/critical-path.md, "Idle gaps of one cause removed").

`idle_cause_removed`: the idle gaps of one cause (analysis.rank.idle's host activity: data
loading, synchronisation, launch bound) on one rank, or on every rank that has them, taken out
of the host work that holds them (the durations of the rank's issues and step end whose
stretch of time they overlap), every step propagated. Gaps are known in the profiled steps only:
the saving is measured there and taken as every analysed step's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.crossrank.clock import to_common_clock
from analysis.crossrank.step_graph import ISSUE, STEP_END, StepGraph
from analysis.crossrank.what_if import IGNORED, MOST_CHANGES, Change

KIND = "idle_cause_removed"
# The causes asked about: those that say what the host did. Waiting for peers is slack, never
# on the path (the rank on time answers it); "other" names no cause.
CAUSES = ("data_loading", "synchronisation", "launch_bound")
GAP_COLUMNS = ["rank", "step", "start_ns", "end_ns", "host_activity"]


def gaps_on_common_clock(gaps: pd.DataFrame, clock: pd.DataFrame,
                         kineto_shift: dict | None = None) -> pd.DataFrame:
    """Idle gaps (analysis.rank.idle.idle_gaps: each rank's Kineto clock) on the common clock
    of the ops: the rank's Kineto shift taken off (its Kineto clock minus its ops' clock), then
    its clock offset and drift, as the ops are moved."""
    if gaps is None or gaps.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    frame = gaps[GAP_COLUMNS].dropna(subset=["rank", "step", "start_ns", "end_ns"])
    frame = frame.astype({"rank": "int64", "step": "int64", "start_ns": "int64",
                          "end_ns": "int64"})
    shift = frame["rank"].map(kineto_shift or {}).fillna(0).to_numpy("int64")
    own = frame.assign(issue_ns=frame["start_ns"] - shift, end_ns=frame["end_ns"] - shift)
    moved = to_common_clock(own, clock)
    return moved.assign(start_ns=moved["issue_ns"])[GAP_COLUMNS].reset_index(drop=True)


def _time_inside(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Time the disjoint, sorted intervals [starts, ends) cover before each `at`."""
    cumulative = np.concatenate([[0], np.cumsum(ends - starts)])
    index = np.searchsorted(starts, at, side="right")
    last = np.maximum(index - 1, 0)
    inside = np.clip(np.minimum(at, ends[last]) - starts[last], 0, None)
    return np.where(index > 0, cumulative[last] + inside, 0)


def without_gaps(graph: StepGraph, gaps: pd.DataFrame,
                 share: pd.Series | None = None) -> np.ndarray:
    """Durations with the time of `gaps` (rank, start_ns, end_ns, common clock) taken out of
    each host-work node of their rank: an issue's or step end's stretch [time - duration,
    time) loses the gap time inside it, or the `share` of it given for the node's step (a
    Series by step number, 1 where not given)."""
    changed = graph.duration.copy()
    work = np.flatnonzero(np.isin(graph.kind, (ISSUE, STEP_END)) & (graph.duration > 0))
    for rank, own in gaps.groupby("rank"):
        nodes = work[graph.rank[work] == rank]
        if not len(nodes):
            continue
        starts, ends = intervals.union(own["start_ns"].to_numpy("int64"),
                                       own["end_ns"].to_numpy("int64"))
        if not len(starts):
            continue
        top, length = graph.time[nodes], graph.duration[nodes]
        inside = _time_inside(starts, ends, top) - _time_inside(starts, ends, top - length)
        if share is not None:
            inside = np.rint(inside * share.reindex(graph.step[nodes]).fillna(1.0).to_numpy()
                             ).astype(np.int64)
        changed[nodes] = length - np.minimum(inside, length)
    return changed


def idle_changes(graph: StepGraph, gaps: pd.DataFrame | None,
                 profiled: pd.DataFrame | None = None) -> list[Change]:
    """Per cause of CAUSES that some rank's gaps in the analysed steps have: one change per
    rank with such gaps (the MOST_CHANGES with most gap time) and, where several ranks have
    them, one for every rank at once. `gaps` on the common clock (gaps_on_common_clock);
    `profiled` the (rank, step) rows whose gaps are known (default: those the gaps have)."""
    if gaps is None or gaps.empty or graph.steps.empty:
        return []
    analysed = pd.MultiIndex.from_frame(graph.steps[["rank", "step"]])
    gaps = gaps[pd.MultiIndex.from_frame(gaps[["rank", "step"]]).isin(analysed)]
    known = (gaps if profiled is None else profiled)[["rank", "step"]].apply(
        pd.to_numeric, errors="coerce").dropna().drop_duplicates().astype("int64")
    known = known[pd.MultiIndex.from_frame(known).isin(analysed)]
    changes = []
    for cause in CAUSES:
        of_cause = gaps[(gaps["host_activity"] == cause).to_numpy()
                        & (gaps["end_ns"] > gaps["start_ns"]).to_numpy()]
        if of_cause.empty:
            continue
        per_rank = (of_cause["end_ns"] - of_cause["start_ns"]).groupby(of_cause["rank"]).sum()
        ranks = per_rank.sort_values(ascending=False, kind="stable").index[:MOST_CHANGES]
        asked = [[int(r)] for r in ranks] + ([sorted(int(r) for r in per_rank.index)]
                                             if len(per_rank) > 1 else [])
        for chosen in asked:
            steps = _steps_known(known, chosen)
            if not len(steps):
                continue
            label = cause.replace("_", " ")
            where = f"rank {chosen[0]}" if len(chosen) == 1 else "any rank"
            on = where if len(chosen) == 1 else "ranks " + ", ".join(map(str, chosen))
            share = _beyond_the_others(of_cause, known, chosen[0]) if len(chosen) == 1 else None
            beyond = (" beyond the other ranks' median in the same step (what every rank "
                      "spends there)" if share is not None else "")
            changes.append(Change({
                "change": f"no {label} gaps on {where}", "kind": KIND, "ranks": chosen,
                "assumptions": f"the idle gaps labelled {cause} (docs/definitions.md, \"Idle "
                               f"gaps\") on {on}{beyond} taken out of the host work between "
                               f"ops that holds them, measured in the {len(steps)} profiled "
                               f"step(s) where gaps are known and taken as every analysed "
                               f"step's saving; the rest of "
                               f"every rank's work and every transfer unchanged; " + IGNORED},
                without_gaps(graph, of_cause[of_cause["rank"].isin(chosen)], share), steps))
    return changes


def _beyond_the_others(gaps: pd.DataFrame, known: pd.DataFrame, rank: int) -> pd.Series | None:
    """Per step (a Series by step number): the share of `rank`'s gap time there above the other
    ranks' median gap time in that step (a rank whose gaps are known and has none there counts
    0), so that the gaps every rank has stay; None where no other rank's gaps are known."""
    others = known[known["rank"] != rank]
    if others.empty:
        return None
    time = (gaps["end_ns"] - gaps["start_ns"]).groupby([gaps["rank"], gaps["step"]]).sum()
    index = pd.MultiIndex.from_frame(others[["rank", "step"]])
    by_other = pd.Series(time.reindex(index).fillna(0).to_numpy("float64"), index=index)
    median = by_other.groupby(level="step").median()
    own = time.xs(rank, level="rank")
    excess = (own - median.reindex(own.index).fillna(0)).clip(lower=0)
    return (excess / own.where(own > 0)).fillna(0)


def _steps_known(known: pd.DataFrame, ranks: list[int]) -> np.ndarray:
    """The steps whose gaps are known on every rank of `ranks`."""
    mine = known[known["rank"].isin(ranks)]
    counts = mine.groupby("step")["rank"].nunique()
    return counts.index[counts == len(ranks)].to_numpy("int64")
