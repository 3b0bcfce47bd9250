"""One clock for all ranks: clock_sync offsets, and an estimate from collective completions.

A synchronising collective (no member can finish before every member has arrived) completes at
nearly the same instant on all members, so per matched instance `end_r - end_ref` is rank r's
clock offset to the group's lowest rank plus noise. Per pair the offset is a robust fit over all
instances: a median, with a Theil-Sen drift term. Pairs are chained from rank 0 over the groups.
Ops timed at issue only (no completion) take no part in the estimate.
Definitions in docs/cross-rank.md.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

CLOCK_COLUMNS = ["rank", "offset_ns", "drift_ns_per_s", "uncertainty_ns", "source",
                 "clock_sync_offset_ns", "estimate_offset_ns", "disagreement_ns", "instances"]
# Ops after which every member has waited for all others.
SYNCHRONISING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
DRIFT_CHUNKS = 10  # Theil-Sen over at most this many time-ordered chunk medians
MIN_DRIFT_CHUNK = 5  # instances per chunk
DRIFT_SIGNIFICANCE = 3.0  # drift is applied when it moves the offset by more than 3 residual sigma
MIN_DRIFT_CHUNKS = 5  # ... fitted over at least 5 chunks (25 instances)
# ... and no steeper than a clock drifts (NTP slews by at most 500 us per second): a steeper
# line is a change in how late a member saw the completions, not its clock.
MAX_DRIFT = 500e-6
MAD_TO_SIGMA = 1.4826
WAITED_RATIO = 2.0  # a member waited for the other when its op lasted over twice as long
ONE_SIDED_SHARE = 0.75  # one member waited in at least this share of the pair's instances


def completion_pairs(matched: pd.DataFrame) -> pd.DataFrame:
    """Per member and instance of a synchronising collective, against the instance's lowest rank
    (ref), on each rank's own clock: t_ns (ref's end), diff_ns = end - ref's end, the causality
    bounds on the offset low_ns = issue - ref's end and high_ns = end - ref's issue, and which of
    the two waited for the other (ref_waited, rank_waited)."""
    sync = matched[(matched["instance"] >= 0) & matched["op"].isin(SYNCHRONISING_OPS)]
    if "timed" in sync.columns:  # an op timed at issue only has no completion to compare
        sync = sync[sync["timed"].astype(bool)]
    ref = sync.loc[sync.groupby("instance")["rank"].idxmin(),
                   ["instance", "rank", "issue_ns", "end_ns"]]
    pairs = sync[["instance", "rank", "issue_ns", "end_ns"]].merge(
        ref.rename(columns={"rank": "ref", "issue_ns": "ref_issue", "end_ns": "t_ns"}),
        on="instance")
    pairs = pairs[pairs["rank"] != pairs["ref"]]
    own = (pairs["end_ns"] - pairs["issue_ns"]).to_numpy()
    theirs = (pairs["t_ns"] - pairs["ref_issue"]).to_numpy()
    return pd.DataFrame({
        "ref": pairs["ref"], "rank": pairs["rank"], "t_ns": pairs["t_ns"],
        "diff_ns": pairs["end_ns"] - pairs["t_ns"],
        "low_ns": pairs["issue_ns"] - pairs["t_ns"],
        "high_ns": pairs["end_ns"] - pairs["ref_issue"],
        "ref_waited": theirs > WAITED_RATIO * own, "rank_waited": own > WAITED_RATIO * theirs,
    })


def _theil_sen(t: np.ndarray, d: np.ndarray) -> float:
    """Slope (ns per ns) through the medians of time-ordered chunks; 0 with under
    MIN_DRIFT_CHUNKS chunks."""
    chunks = min(DRIFT_CHUNKS, len(t) // MIN_DRIFT_CHUNK)
    if chunks < MIN_DRIFT_CHUNKS:
        return 0.0
    order = np.argsort(t, kind="stable")
    parts = np.array_split(order, chunks)
    tm = np.array([np.median(t[p]) for p in parts])
    dm = np.array([np.median(d[p]) for p in parts])
    i, j = np.triu_indices(chunks, 1)
    dt = tm[j] - tm[i]
    keep = dt > 0
    return float(np.median((dm[j] - dm[i])[keep] / dt[keep])) if keep.any() else 0.0


def _median_fit(t: np.ndarray, d: np.ndarray) -> tuple[float, float, float]:
    """(level, slope, sigma): a median, with a Theil-Sen slope where drift exceeds the noise."""
    slope = _theil_sen(t, d)
    residual = d - slope * t
    level = float(np.median(residual))
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(residual - level)))
    span = float(t.max() - t.min()) if len(t) else 0.0
    if abs(slope) * span <= DRIFT_SIGNIFICANCE * max(sigma, 1.0) or abs(slope) > MAX_DRIFT:
        # No drift beyond the noise: a plain median, which noise cannot tilt.
        slope = 0.0
        level = float(np.median(d))
        sigma = MAD_TO_SIGMA * float(np.median(np.abs(d - level)))
    return level, slope, sigma


def fit_pair(t: np.ndarray, d: np.ndarray, t0: int, low: np.ndarray | None = None,
             high: np.ndarray | None = None, ref_waited: np.ndarray | None = None,
             rank_waited: np.ndarray | None = None) -> tuple[float, float, float]:
    """(offset at t0, drift ns per ns, uncertainty) of one pair from its completion differences
    `d`, within the causality bounds [max low, min high] (docs/cross-rank.md, "One clock").

    A member that waited is blocked in the op and sees it complete at once; the last to arrive
    may be busy and see it late. So where one side waited in most instances, the completion
    differences lie on one side of the offset: their envelope (min or max) bounds it softly, the
    causality bound on the other side, and the estimate is the middle of that bracket (as NTP
    takes the middle of a round trip). Where both sides waited in turn, their lateness cancels
    in a median.
    """
    t = t.astype("float64") - t0
    d = d.astype("float64")
    level, slope, sigma = _median_fit(t, d)
    if low is None or not len(t):
        return level, slope, sigma
    trend = slope * t
    lo = float(np.max(low - trend))
    hi = float(np.min(high - trend))
    residual = d - trend
    ref_share, rank_share = float(np.mean(ref_waited)), float(np.mean(rank_waited))
    # A difference beyond the causality bound on the envelope's side is an instance in which the
    # member that waited saw the completion late (descheduled), not a point of the envelope.
    if ref_share >= ONE_SIDED_SHARE and rank_share <= 1 - ONE_SIDED_SHARE:
        envelope = residual[ref_waited & (residual >= lo)]
        if len(envelope):  # d = offset + the rank's lateness
            hi = min(hi, float(np.min(envelope)))
    elif rank_share >= ONE_SIDED_SHARE and ref_share <= 1 - ONE_SIDED_SHARE:
        envelope = residual[rank_waited & (residual <= hi)]
        if len(envelope):  # d = offset - ref's lateness
            lo = max(lo, float(np.max(envelope)))
    bracketed = max(ref_share, rank_share) >= ONE_SIDED_SHARE and lo <= hi
    if bracketed:
        return (lo + hi) / 2, slope, (hi - lo) / 2
    if lo <= hi:
        level = min(max(level, lo), hi)
        sigma = min(sigma, (hi - lo) / 2)
    return level, slope, sigma


def estimate_offsets(matched: pd.DataFrame, reference: int = 0) -> pd.DataFrame:
    """Per rank reachable from `reference`: (offset_ns at t0, drift, uncertainty, instances, t0).

    Each pair (group's lowest rank, member) gets a robust fit; the offsets are chained from the
    reference over the pair with most instances first (breadth first).
    """
    columns = ["rank", "offset_ns", "drift", "uncertainty_ns", "instances", "t0"]
    # No matched synchronising collective (one rank's trace): no pair, and no pandas work.
    synchronising = (matched["instance"] >= 0) & matched["op"].isin(SYNCHRONISING_OPS)
    pairs = completion_pairs(matched) if synchronising.any() else None
    if pairs is None or pairs.empty:
        return pd.DataFrame(columns=columns)
    t0 = int(pairs["t_ns"].min())
    edges = {}
    for (ref, rank), group in pairs.groupby(["ref", "rank"], sort=True):
        level, slope, sigma = fit_pair(
            group["t_ns"].to_numpy(), group["diff_ns"].to_numpy(), t0,
            group["low_ns"].to_numpy(dtype="float64"), group["high_ns"].to_numpy(dtype="float64"),
            group["ref_waited"].to_numpy(), group["rank_waited"].to_numpy())
        edges[(int(ref), int(rank))] = (level, slope, sigma, len(group))
    links: dict = {}
    for (a, b), (level, slope, sigma, n) in edges.items():
        links.setdefault(a, []).append((b, level, slope, sigma, n))
        links.setdefault(b, []).append((a, -level, -slope, sigma, n))
    known = {reference: (0.0, 0.0, 0.0, 0)}
    queue = deque([reference])
    while queue:
        node = queue.popleft()
        base = known[node]
        for other, level, slope, sigma, n in sorted(links.get(node, []), key=lambda e: -e[4]):
            if other not in known:
                known[other] = (base[0] + level, base[1] + slope, float(np.hypot(base[2], sigma)),
                                n)
                queue.append(other)
    rows = [(rank, *values, t0) for rank, values in sorted(known.items()) if rank != reference]
    return pd.DataFrame(rows, columns=columns)


def clock_table(matched: pd.DataFrame, clock_sync: pd.DataFrame, ranks, reference: int = 0
                ) -> pd.DataFrame:
    """Per rank: the offset used (clock_sync where present, else the estimate), its source and
    uncertainty, both estimates and their disagreement."""
    estimate = estimate_offsets(matched, reference).set_index("rank")
    sync = clock_sync.set_index("rank") if len(clock_sync) else pd.DataFrame(
        columns=["offset_ns", "uncertainty_ns"])
    rows = []
    for rank in sorted(set(int(r) for r in ranks)):
        has_sync = rank in sync.index
        has_est = rank in estimate.index
        est = estimate.loc[rank] if has_est else None
        sync_offset = float(sync.loc[rank, "offset_ns"]) if has_sync else np.nan
        est_offset = float(est["offset_ns"]) if has_est else np.nan
        if rank == reference:
            offset, drift, uncertainty, source = 0.0, 0.0, 0.0, "reference"
            est_offset = 0.0 if has_est or not has_sync else est_offset
        elif has_sync:
            offset, drift = sync_offset, 0.0
            uncertainty, source = float(sync.loc[rank, "uncertainty_ns"]), "clock_sync"
        elif has_est:
            offset, drift = est_offset, float(est["drift"])
            uncertainty, source = float(est["uncertainty_ns"]), "collectives"
        else:
            offset, drift, uncertainty, source = 0.0, 0.0, np.nan, "none"
        rows.append({
            "rank": rank, "offset_ns": int(round(offset)), "drift_ns_per_s": drift * 1e9,
            "uncertainty_ns": uncertainty, "source": source,
            "clock_sync_offset_ns": sync_offset, "estimate_offset_ns": est_offset,
            "disagreement_ns": sync_offset - est_offset,
            "instances": int(est["instances"]) if has_est else 0,
        })
    table = pd.DataFrame(rows, columns=CLOCK_COLUMNS)
    table.attrs["t0"] = int(estimate["t0"].iloc[0]) if len(estimate) else 0
    return table


def to_common_clock(ops: pd.DataFrame, clock: pd.DataFrame) -> pd.DataFrame:
    """`issue_ns`, `end_ns` on the reference rank's clock: own time - offset(t)."""
    t0 = clock.attrs.get("t0", 0)
    per_rank = clock.set_index("rank")
    offset = ops["rank"].map(per_rank["offset_ns"]).fillna(0).to_numpy(dtype="float64")
    drift = ops["rank"].map(per_rank["drift_ns_per_s"]).fillna(0).to_numpy() / 1e9
    out = ops.copy()
    for column in ("issue_ns", "end_ns"):
        own = ops[column].to_numpy()
        shift = offset + drift * (own - t0).astype("float64")
        out[column] = own - np.rint(shift).astype("int64")
    return out
