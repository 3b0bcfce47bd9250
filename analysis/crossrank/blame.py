"""Blame along waiting chains: who a wait is charged to (docs/cross-rank.md, "Culprit").

An instance's last arriver L caused the others' waits. When L arrived late because it was itself
waiting for another rank M in an earlier op (L's own wait for peers overlaps the window in which
the others waited for L), that part of the caused wait is passed on to whoever the earlier op's
wait is charged to (M, or further along M's own chain); L keeps the rest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals

BLAME_COLUMNS = ["instance", "culprit", "caused_ns"]


def _waited_time(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Time spent inside the (disjoint, sorted) intervals before each `at`."""
    cumulative = np.concatenate([[0], np.cumsum(ends - starts)])
    index = np.searchsorted(starts, at, side="right")  # intervals starting before `at`
    before = cumulative[np.maximum(index - 1, 0)]
    inside = np.where(index > 0, np.minimum(at, ends[np.maximum(index - 1, 0)])
                      - starts[np.maximum(index - 1, 0)], 0)
    return np.where(index > 0, before + np.maximum(inside, 0), 0)


def blame(waits: pd.DataFrame) -> pd.DataFrame:
    """One row per instance and rank charged with (part of) its caused wait (the sum of its
    waiting members' wait_for_peers): instance, culprit, caused_ns."""
    if waits.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in BLAME_COLUMNS})
    waited = waits[(waits["wait_ns"] > 0) & (waits["rank"] != waits["last_rank"])]
    caused = waited.groupby("instance")["wait_ns"].sum()
    last = waits.drop_duplicates("instance").set_index("instance")["last_rank"]
    charges = {i: {int(last[i]): float(c)} for i, c in caused.items()}
    # Each rank's own waits for peers: [arrival, arrival + wait) on the common clock.
    own = pd.DataFrame({"rank": waited["rank"], "instance": waited["instance"],
                        "start": waited["arrival_ns"],
                        "end": waited["arrival_ns"] + waited["wait_ns"]}).sort_values("start")
    if own.empty:
        return _frame(charges)
    windows = waited.assign(last_arrival=waited["arrival_ns"] + waited["wait_ns"])
    # Which instances' windows overlap any own wait of their last arriver (cheap prefilter).
    by_rank = {r: group for r, group in own.groupby("rank")}
    overlap = np.zeros(len(windows))
    for rank, group in by_rank.items():
        mine = (windows["last_rank"] == rank).to_numpy()
        if not mine.any():
            continue
        starts, ends = intervals.union(group["start"].to_numpy(), group["end"].to_numpy())
        w = windows[mine]
        overlap[mine] = (_waited_time(starts, ends, w["last_arrival"].to_numpy())
                         - _waited_time(starts, ends, w["arrival_ns"].to_numpy()))
    chained = windows[overlap > 0]
    order = chained.groupby("instance")["last_arrival"].max().sort_values()
    for instance in order.index:
        culprit = int(last[instance])
        victims = chained[chained["instance"] == instance]
        mine = by_rank[culprit]
        before = mine[(mine["start"] < order[instance]) & (mine["instance"] != instance)]
        passed = {}
        for j, start, end in zip(before["instance"], before["start"], before["end"]):
            share = np.maximum(np.minimum(end, victims["last_arrival"].to_numpy())
                               - np.maximum(start, victims["arrival_ns"].to_numpy()), 0).sum()
            if share > 0:
                passed[j] = passed.get(j, 0.0) + float(share)
        total = sum(passed.values())
        scale = min(1.0, caused[instance] / total) if total > 0 else 0.0
        result = {culprit: float(caused[instance])}
        for j, share in passed.items():
            moved = share * scale
            result[culprit] -= moved
            # An earlier op's wait goes where that op's caused wait went (its chain resolved).
            roots = charges.get(j) or {int(last[j]): 1.0}
            whole = sum(roots.values())
            for root, amount in roots.items():
                result[root] = result.get(root, 0.0) + moved * amount / whole
        charges[instance] = result
    return _frame(charges)


def _frame(charges: dict) -> pd.DataFrame:
    rows = [(i, r, c) for i, per in charges.items() for r, c in per.items() if c > 0]
    table = pd.DataFrame(rows, columns=BLAME_COLUMNS)
    return table.astype({"instance": "int64", "culprit": "int64", "caused_ns": "float64"})
