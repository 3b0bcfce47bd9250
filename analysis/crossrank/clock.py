"""One clock for all ranks: clock_sync offsets, and an estimate from collective completions.

A synchronising collective (no member can finish before every member has arrived) completes at
nearly the same instant on all members, so per matched instance `end_r - end_ref` is rank r's
clock offset to the group's lowest rank plus noise. Per pair the offset is a robust fit over all
instances: a median, with a Theil-Sen drift term where enough instances span enough time,
bracketed by causality and by the completions of the members that waited. Pairs are chained
from rank 0 over the groups. Ops timed at issue only (no completion) take no part in the
estimate; a record's op timed by its profiled step's op does (analysis.rank.comm.profiled).
The estimate replaces clock_sync where clock_sync is missing or contradicts causality; a rank
reached by neither has no known clock, and its instances are placed nowhere (unplaced_rows).
Definitions in docs/cross-rank.md.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
import pandas as pd

from analysis.rank.comm.profiled import FROM_PROFILED, FROM_TRACE

CLOCK_COLUMNS = ["rank", "offset_ns", "drift_ns_per_s", "uncertainty_ns", "source",
                 "clock_sync_offset_ns", "estimate_offset_ns", "disagreement_ns", "instances",
                 "estimate_from"]
ESTIMATE_COLUMNS = ["rank", "offset_ns", "drift", "uncertainty_ns", "instances", "t0",
                    "estimate_from", "low_ns", "high_ns"]
# Ends that are the op's own completion, not its issuing thread's observation of it.
OWN_COMPLETION = (FROM_TRACE, FROM_PROFILED)
# Where a rank's offset comes from (the clock table's `source`).
REFERENCE, CLOCK_SYNC, COLLECTIVES, NONE = "reference", "clock_sync", "collectives", "none"
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
# clock_sync disagrees with the collectives (docs/cross-rank.md, "One clock") where it lies
# outside their causality bounds by more than its uncertainty and this slack (the trace's clock
# is put on the records' within a few us).
CAUSALITY_SLACK_NS = 50_000
# The members' own completions of one op (a gloo all-reduce's end on each rank's worker thread)
# lie within about 0.2 ms of each other on one host when no thread is descheduled.
OWN_SLACK_NS = 250_000


def completion_pairs(matched: pd.DataFrame) -> pd.DataFrame:
    """Per member and instance of a synchronising collective, against the instance's lowest rank
    (ref), on each rank's own clock: t_ns (ref's end), diff_ns = end - ref's end, the causality
    bounds on the offset low_ns = issue - ref's end and high_ns = end - ref's issue, and which of
    the two waited for the other (ref_waited, rank_waited); `time_from` and `ref_from`: where
    the two ends come from (None where the ops do not say)."""
    sync = matched[(matched["instance"] >= 0) & matched["op"].isin(SYNCHRONISING_OPS)]
    if "timed" in sync.columns:  # an op timed at issue only has no completion to compare
        sync = sync[sync["timed"].astype(bool)]
    sync = sync.assign(time_from=sync["time_from"] if "time_from" in sync.columns else None)
    columns = ["instance", "rank", "issue_ns", "end_ns", "time_from"]
    ref = sync.loc[sync.groupby("instance")["rank"].idxmin(), columns]
    pairs = sync[columns].merge(
        ref.rename(columns={"rank": "ref", "issue_ns": "ref_issue", "end_ns": "t_ns",
                            "time_from": "ref_from"}), on="instance")
    pairs = pairs[pairs["rank"] != pairs["ref"]]
    own = (pairs["end_ns"] - pairs["issue_ns"]).to_numpy()
    theirs = (pairs["t_ns"] - pairs["ref_issue"]).to_numpy()
    return pd.DataFrame({
        "ref": pairs["ref"], "rank": pairs["rank"], "t_ns": pairs["t_ns"],
        "diff_ns": pairs["end_ns"] - pairs["t_ns"],
        "low_ns": pairs["issue_ns"] - pairs["t_ns"],
        "high_ns": pairs["end_ns"] - pairs["ref_issue"],
        "ref_waited": theirs > WAITED_RATIO * own, "rank_waited": own > WAITED_RATIO * theirs,
        "time_from": pairs["time_from"], "ref_from": pairs["ref_from"],
    })


def _theil_sen(t: np.ndarray, d: np.ndarray) -> float:
    """Slope (ns per ns) through the medians of time-ordered chunks; NaN with under
    MIN_DRIFT_CHUNKS chunks (too few instances to fit a drift)."""
    chunks = min(DRIFT_CHUNKS, len(t) // MIN_DRIFT_CHUNK)
    if chunks < MIN_DRIFT_CHUNKS:
        return float("nan")
    order = np.argsort(t, kind="stable")
    parts = np.array_split(order, chunks)
    tm = np.array([np.median(t[p]) for p in parts])
    dm = np.array([np.median(d[p]) for p in parts])
    i, j = np.triu_indices(chunks, 1)
    dt = tm[j] - tm[i]
    keep = dt > 0
    return float(np.median((dm[j] - dm[i])[keep] / dt[keep])) if keep.any() else 0.0


def _median_fit(t: np.ndarray, d: np.ndarray) -> tuple[float, float, float]:
    """(level, slope, sigma): a median, with a Theil-Sen slope where drift exceeds the noise;
    the slope is 0 where it does not, and NaN where too few instances fit none."""
    slope = _theil_sen(t, d)
    plain = float(np.median(d))
    plain_sigma = MAD_TO_SIGMA * float(np.median(np.abs(d - plain)))
    if np.isnan(slope):
        return plain, slope, plain_sigma
    residual = d - slope * t
    level = float(np.median(residual))
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(residual - level)))
    span = float(t.max() - t.min()) if len(t) else 0.0
    if abs(slope) * span <= DRIFT_SIGNIFICANCE * max(sigma, 1.0) or abs(slope) > MAX_DRIFT:
        # No drift beyond the noise: a plain median, which noise cannot tilt.
        return plain, 0.0, plain_sigma
    return level, slope, sigma


def fit_pair(t: np.ndarray, d: np.ndarray, t0: int, low: np.ndarray | None = None,
             high: np.ndarray | None = None, ref_waited: np.ndarray | None = None,
             rank_waited: np.ndarray | None = None, own: np.ndarray | None = None
             ) -> tuple[float, float, float]:
    """(offset at t0, drift ns per ns, uncertainty) of one pair from its completion differences
    `d`, within the causality bounds [max low, min high] (docs/cross-rank.md, "One clock"). The
    drift is NaN where too few instances fit one (none is applied). `own`: per instance,
    whether both ends are the op's own completion (an op read from a trace: a kernel, a gloo
    op on gloo's worker thread) rather than its issuing thread's observation of it; where any
    is, those instances alone give the estimate (_fit_own), else _fit_observed does."""
    t = t.astype("float64") - t0
    d = d.astype("float64")
    if low is not None and own is not None and own.any():
        return _fit_own(t[own], d[own], low[own], high[own])
    level, slope, sigma = _median_fit(t, d)
    if low is None or not len(t):
        return level, slope, sigma
    return _fit_observed(t, d, low, high, ref_waited, rank_waited, (level, slope, sigma))


def _fit_own(t: np.ndarray, d: np.ndarray, low: np.ndarray, high: np.ndarray
             ) -> tuple[float, float, float]:
    """An op's own completion is nearly the same instant on every member (one host's ranks end
    a gloo all-reduce within about 0.2 ms), but where a member's thread was descheduled as the
    op ended: its difference then strays, often by more than the op lasted, and a busy rank's
    threads can be late in most instances. Differences beyond the causality bounds (less the
    fitted drift) are such strays and are left out; the median fit of the rest is the offset
    where it lies within the envelopes of the members that waited (_own_envelopes) by
    OWN_SLACK_NS, its spread, at least OWN_SLACK_NS, the uncertainty. A median outside them was
    pulled by late threads in most instances: the estimate is then the middle of the bracket
    that causality and the envelopes leave, its half-width the uncertainty. An envelope is as
    soft as the members' own completions are apart (OWN_SLACK_NS), so the bracket takes that
    slack on each envelope's side, within the causality bounds."""
    lo, hi, residual = _bounds(t, d, low, high, _median_fit(t, d)[1])
    allowed = (residual >= lo) & (residual <= hi) if lo <= hi else np.ones(len(d), dtype=bool)
    if not allowed.any():
        allowed[:] = True
    level, slope, sigma = _median_fit(t[allowed], d[allowed])
    lo, hi, residual = _bounds(t, d, low, high, slope)
    if lo > hi:  # no offset satisfies every instance (a clock that stepped): the fit alone
        return level, slope, sigma
    bottom, top = _own_envelopes(residual, low + high - d, allowed, level, lo, hi)
    bottom, top = bottom - OWN_SLACK_NS, top + OWN_SLACK_NS
    if bottom <= level <= top:
        level = min(max(level, lo), hi)
        return level, slope, min(max(sigma, OWN_SLACK_NS), (hi - lo) / 2)
    bottom, top = max(lo, bottom), min(hi, top)
    return (bottom + top) / 2, slope, (top - bottom) / 2


def _own_envelopes(residual: np.ndarray, issue_gap: np.ndarray, allowed: np.ndarray,
                   level: float, lo: float, hi: float) -> tuple[float, float]:
    """(bottom, top) of the offset that the members that waited allow, within [lo, hi]. A
    member that issued the op over OWN_SLACK_NS before the other (`issue_gap`: the rank's issue
    minus the reference's, own clocks, read at offset `level`) waited, blocked, and saw the
    completion at once: d = offset + the other's lateness where the reference waited, offset -
    the reference's lateness where the rank did. Each envelope is a quartile of its
    differences, not its extreme, so that a quarter of them may come from a waiting member
    that was itself descheduled."""
    gap = issue_gap - level
    usable = allowed & (residual >= lo) & (residual <= hi)
    ref_waited, rank_waited = usable & (gap > OWN_SLACK_NS), usable & (gap < -OWN_SLACK_NS)
    top = min(hi, float(np.quantile(residual[ref_waited], 0.25))) if ref_waited.any() else hi
    bottom = (max(lo, float(np.quantile(residual[rank_waited], 0.75))) if rank_waited.any()
              else lo)
    return (lo, hi) if bottom > top else (bottom, top)


def _bounds(t: np.ndarray, d: np.ndarray, low: np.ndarray, high: np.ndarray, slope: float
            ) -> tuple[float, float, np.ndarray]:
    """(max low, min high, d) less the drift line through t = 0 (none where NaN)."""
    trend = (0.0 if np.isnan(slope) else slope) * t
    return float(np.max(low - trend)), float(np.min(high - trend)), d - trend


def _fit_observed(t: np.ndarray, d: np.ndarray, low: np.ndarray, high: np.ndarray,
                  ref_waited: np.ndarray, rank_waited: np.ndarray, fit: tuple
                  ) -> tuple[float, float, float]:
    """Ends observed by the issuing thread (host-timed records): a member that waited is blocked
    in the op and sees it complete at once; the last to arrive may be busy and see it late. So
    where one side waited in most instances, the completion differences lie on one side of the
    offset: their envelope (min or max) bounds it softly, the causality bound on the other side,
    and the estimate is the middle of that bracket (as NTP takes the middle of a round trip).
    Where both sides waited in turn, their lateness cancels in the median fit (`fit`: level,
    slope, sigma), clipped to the causality bounds."""
    level, slope, sigma = fit
    trend = (0.0 if np.isnan(slope) else slope) * t
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
    """Per rank reachable from `reference` (ESTIMATE_COLUMNS): offset_ns at t0, drift (ns per
    ns; NaN where a pair of the chain had too few instances to fit one), uncertainty,
    instances, t0, estimate_from (where the instances' ends come from, e.g. "profiled steps,
    records"; None where the ops do not say) and the causality bounds that every instance puts
    on a constant offset (low_ns, high_ns; low above high where none satisfies them all).

    Each pair (group's lowest rank, member) gets a robust fit; the offsets are chained from the
    reference over the pair with most instances first (breadth first): offsets, drifts and
    bounds add, uncertainties add in quadrature.
    """
    # No matched synchronising collective (one rank's trace): no pair, and no pandas work.
    synchronising = (matched["instance"] >= 0) & matched["op"].isin(SYNCHRONISING_OPS)
    pairs = completion_pairs(matched) if synchronising.any() else None
    if pairs is None or pairs.empty:
        return pd.DataFrame(columns=ESTIMATE_COLUMNS)
    t0 = int(pairs["t_ns"].min())
    links: dict = {}
    for (ref, rank), group in pairs.groupby(["ref", "rank"], sort=True):
        link = _pair_link(group, t0)
        links.setdefault(int(ref), []).append((int(rank), link))
        links.setdefault(int(rank), []).append((int(ref), link.reversed()))
    known = {reference: _Link(0.0, 0.0, 0.0, 0, frozenset(), 0.0, 0.0)}
    queue = deque([reference])
    while queue:
        node = queue.popleft()
        for other, link in sorted(links.get(node, []), key=lambda e: -e[1].instances):
            if other not in known:
                known[other] = known[node].then(link)
                queue.append(other)
    rows = [(rank, link.offset, link.drift, link.sigma, link.instances, t0,
             ", ".join(sorted(link.sources)) if link.sources else None, link.low, link.high)
            for rank, link in sorted(known.items()) if rank != reference]
    return pd.DataFrame(rows, columns=ESTIMATE_COLUMNS)


class _Link(NamedTuple):
    """One pair's fit (rank minus ref), or a chain of them from the reference."""
    offset: float
    drift: float  # NaN: not fitted
    sigma: float
    instances: int
    sources: frozenset
    low: float
    high: float

    def reversed(self) -> _Link:
        return self._replace(offset=-self.offset, drift=-self.drift, low=-self.high,
                             high=-self.low)

    def then(self, link: _Link) -> _Link:
        return _Link(self.offset + link.offset, self.drift + link.drift,
                     float(np.hypot(self.sigma, link.sigma)), link.instances,
                     self.sources | link.sources, self.low + link.low, self.high + link.high)


def _pair_link(group: pd.DataFrame, t0: int) -> _Link:
    """fit_pair over one pair's completion_pairs rows, with the causality bounds of them all."""
    own = (group["time_from"].isin(OWN_COMPLETION)
           & group["ref_from"].isin(OWN_COMPLETION)).to_numpy(dtype=bool)
    low, high = (group[c].to_numpy(dtype="float64") for c in ("low_ns", "high_ns"))
    level, slope, sigma = fit_pair(group["t_ns"].to_numpy(), group["diff_ns"].to_numpy(), t0,
                                   low, high, group["ref_waited"].to_numpy(),
                                   group["rank_waited"].to_numpy(), own)
    used = group[own] if own.any() else group  # the instances the fit stood on
    sources = frozenset(v for v in pd.concat([used["time_from"], used["ref_from"]])
                        if isinstance(v, str))
    return _Link(level, slope, sigma, len(group), sources, float(np.max(low)),
                 float(np.min(high)))


def disagrees(sync_offset: float, sync_uncertainty: float, estimate) -> bool:
    """Whether clock_sync's offset contradicts the collectives (a row of estimate_offsets): it
    lies outside the causality bounds that every matched instance puts on a constant offset by
    more than its uncertainty and CAUSALITY_SLACK_NS. Only causality counts against it: an
    estimate's error (a busy rank's threads seeing completions late in most instances) can
    exceed its spread by several ms on a loaded machine, a bound holds however late a member saw
    a completion."""
    slack = float(np.nan_to_num(sync_uncertainty)) + CAUSALITY_SLACK_NS
    low, high = float(estimate["low_ns"]), float(estimate["high_ns"])
    return low <= high and not low - slack <= sync_offset <= high + slack


def clock_table(matched: pd.DataFrame, clock_sync: pd.DataFrame, ranks, reference: int = 0
                ) -> pd.DataFrame:
    """Per rank (CLOCK_COLUMNS): the offset used, its drift, uncertainty and `source`: clock_sync
    where it is present and agrees with the collectives' estimate (`disagrees`), else the
    estimate ("collectives"), else none (offset 0, uncertainty and drift NaN); both offsets,
    their disagreement, and where the estimate's instances come from. drift_ns_per_s is the
    drift applied: 0 for the reference and clock_sync (one measurement), the estimate's where
    it uses one, NaN where too few instances fit one (none applied)."""
    estimate = estimate_offsets(matched, reference).set_index("rank")
    sync = clock_sync.set_index("rank") if len(clock_sync) else pd.DataFrame(
        columns=["offset_ns", "uncertainty_ns"])
    rows = []
    for rank in sorted(set(int(r) for r in ranks)):
        has_sync = rank in sync.index
        has_est = rank in estimate.index
        est = estimate.loc[rank] if has_est else None
        sync_offset = float(sync.loc[rank, "offset_ns"]) if has_sync else np.nan
        sync_uncertainty = float(sync.loc[rank, "uncertainty_ns"]) if has_sync else np.nan
        est_offset = float(est["offset_ns"]) if has_est else np.nan
        if rank == reference:
            offset, drift, uncertainty, source = 0.0, 0.0, 0.0, REFERENCE
            est_offset = 0.0 if has_est or not has_sync else est_offset
        elif has_est and (not has_sync or disagrees(sync_offset, sync_uncertainty, est)):
            offset, drift = est_offset, float(est["drift"])
            uncertainty, source = float(est["uncertainty_ns"]), COLLECTIVES
        elif has_sync:
            offset, drift, uncertainty, source = sync_offset, 0.0, sync_uncertainty, CLOCK_SYNC
        else:
            offset, drift, uncertainty, source = 0.0, np.nan, np.nan, NONE
        rows.append({
            "rank": rank, "offset_ns": int(round(offset)), "drift_ns_per_s": drift * 1e9,
            "uncertainty_ns": uncertainty, "source": source,
            "clock_sync_offset_ns": sync_offset, "estimate_offset_ns": est_offset,
            "disagreement_ns": sync_offset - est_offset,
            "instances": int(est["instances"]) if has_est else 0,
            "estimate_from": est["estimate_from"] if has_est else None,
        })
    table = pd.DataFrame(rows, columns=CLOCK_COLUMNS)
    table.attrs["t0"] = int(estimate["t0"].iloc[0]) if len(estimate) else 0
    return table


def unplaced_rows(matched: pd.DataFrame, clock: pd.DataFrame) -> np.ndarray:
    """Per row of `matched`: whether its instance has a member whose clock is not known
    (source none), so that no time of it can be compared with another member's."""
    unknown = clock.loc[clock["source"] == NONE, "rank"].to_numpy()
    instance = matched["instance"].to_numpy()
    if not len(unknown) or not len(matched):
        return np.zeros(len(matched), dtype=bool)
    hit = np.unique(instance[np.isin(matched["rank"].to_numpy(), unknown) & (instance >= 0)])
    return np.isin(instance, hit) & (instance >= 0)


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
