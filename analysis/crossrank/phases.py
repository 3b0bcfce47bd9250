"""Phases: the stretches of a run in which every rank's step time and wait for peers are steady,
each judged on its own steps (docs/definitions.md, "Phases").

The series are each rank's step time and wait for peers over every analysed step (with more
than MAX_RANK_SERIES ranks: the median and the largest step time, and the smallest and the
largest wait, across ranks). Each is smoothed by a rolling median of FILTER_STEPS steps (a
median keeps a change's edge where it is and drops a hiccup of one or two steps), and a run
longer than MAX_POINTS steps is cut on the means of consecutive steps. Each series is divided
by its noise (1.4826 x the median absolute deviation of its step-to-step differences over the
square root of 2: a robust standard deviation that a change of level leaves alone, at least
NOISE_FLOOR_MS), and ruptures' kernel change-point search with a linear kernel (a change in
the mean, least squares) cuts it where a cut saves more than PENALTY_FACTOR x series x
log(points). Each cut is then placed to the step on the smoothed steps around it.

A cut only makes a phase when it matters: two neighbouring stretches stay apart when a rank's
mean wait for peers in one is at least MIN_WAIT_RATIO times the other's, and that difference,
over the shorter one's steps, is at least MIN_SHARE_PCT of the run's time; and, where the
cross-rank pass matched ops, when the straggler rule (analysis.crossrank.culprit) names a late
rank on the steps of one of them. A phase is a change of who waits for whom, and for which
late rank: the whole job's step time alone makes none. Otherwise neighbours are one phase (the
pair whose difference makes the least time first, until every neighbour differs). Each phase is
then judged on its own steps: its late rank by the straggler rule, and the what-if answers
(analysis.crossrank.what_if) averaged over its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.core.contracts import CriticalPath, CrossRank, Phase
from analysis.crossrank.culprit import MIN_SHARE_PCT, find_stragglers
from analysis.crossrank.what_if import told_order

MIN_PHASE_STEPS = 10  # no phase shorter: the straggler rule needs about this many steps
FILTER_STEPS = 5  # the rolling median: a hiccup of up to 2 steps in a row is no change
MAX_POINTS = 500  # a longer run is searched on the means of consecutive steps
MAX_RANK_SERIES = 8  # up to this many ranks, each rank's own series; more: across-rank ones
NOISE_FLOOR_MS = 0.05  # a series steadier than this is taken as this noisy
PENALTY_FACTOR = 4.0  # x series x log(points): what a cut must save, in units of noise^2
MIN_WAIT_RATIO = 1.5  # a rank waits at least this much more (or less) than in the neighbour
# The whole job's step time alone makes no phase: other work on a shared host slows every rank
# alike (measured: 1 ms steps 3x slower for 168 steps, 5.5x for 323 at load 12 on 2 cores),
# while a slow host in a job of several shows as its ranks' lateness, which the others wait for.
MAX_CUTS = 15  # more cuts than this: the penalty is doubled until there are at most this many
MIN_WAIT_MS = 0.05  # a rank waiting less than this per step is not named as waiting
# What-if kinds not answered per phase: a formula's estimate, a change of scale
# (analysis.findings.verdict quotes neither).
NOT_PER_PHASE = ("pipeline_microbatches", "host_work_halved")


def phase_input_rows(per_step: pd.DataFrame) -> pd.DataFrame:
    """The (rank, step, step_ns, peer_wait_ns) rows of the analysed steps, as numbers: rank and
    step known, step_ns > 0 (a table without waits has them all unknown)."""
    rows = per_step.reindex(columns=["rank", "step", "step_ns", "peer_wait_ns"]).apply(
        pd.to_numeric, errors="coerce")
    return rows[rows["rank"].notna() & rows["step"].notna() & (rows["step_ns"] > 0)]


def step_series(per_step: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(the analysed steps, sorted; a matrix of one row per step and one column per series, ms):
    each rank's step time and wait (a wait not known, or a step a rank lacks, takes its
    neighbour's value), or the across-rank series with more than MAX_RANK_SERIES ranks."""
    rows = phase_input_rows(per_step)
    steps, step_at = np.unique(rows["step"].to_numpy(), return_inverse=True)
    steps = steps.astype("int64")
    _, rank_at = np.unique(rows["rank"].to_numpy(), return_inverse=True)
    at = (step_at, rank_at)
    step_ms = pd.DataFrame(_mean_grid(rows["step_ns"].to_numpy(), at) / 1e6).ffill().bfill()
    wait_ms = pd.DataFrame(_mean_grid(rows["peer_wait_ns"].to_numpy(), at) / 1e6)
    wait_ms = wait_ms.ffill().bfill().fillna(0.0)
    if step_ms.shape[1] <= MAX_RANK_SERIES:
        matrix = np.hstack([step_ms.to_numpy(), wait_ms.to_numpy()])
    else:
        matrix = np.column_stack([step_ms.median(axis=1), step_ms.max(axis=1),
                                  wait_ms.min(axis=1), wait_ms.max(axis=1)])
    return steps, matrix.astype("float64")


def _mean_grid(values: np.ndarray, at: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The mean of the known `values` at each (row, column) of `at`, NaN where none is known
    (a pivot table's, without its cost: 8-12 ms for five rows)."""
    shape = (int(at[0].max()) + 1, int(at[1].max()) + 1) if len(values) else (0, 0)
    known = ~np.isnan(values)
    sums, counts = np.zeros(shape), np.zeros(shape)
    np.add.at(sums, (at[0][known], at[1][known]), values[known])
    np.add.at(counts, (at[0][known], at[1][known]), 1.0)
    return np.divide(sums, counts, out=np.full(shape, np.nan), where=counts > 0)


def rolling_median(matrix: np.ndarray, width: int = FILTER_STEPS) -> np.ndarray:
    """Each column's median over `width` steps centred on each step (edges repeated)."""
    if len(matrix) < width:
        return matrix
    half = width // 2
    padded = np.pad(matrix, ((half, half), (0, 0)), mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=0)
    return np.median(windows, axis=-1)


def series_noise(matrix: np.ndarray) -> np.ndarray:
    """Each column's noise, ms: 1.4826 x MAD of its step-to-step differences / sqrt(2), at
    least NOISE_FLOOR_MS."""
    if len(matrix) < 3:
        return np.full(matrix.shape[1], NOISE_FLOOR_MS)
    diffs = np.diff(matrix, axis=0)
    mad = np.median(np.abs(diffs - np.median(diffs, axis=0)), axis=0)
    return np.maximum(1.4826 * mad / math.sqrt(2), NOISE_FLOOR_MS)


def _point_means(matrix: np.ndarray) -> tuple[np.ndarray, int]:
    """(the rows as at most MAX_POINTS points, each the mean of `size` consecutive rows; size)."""
    size = -(-len(matrix) // MAX_POINTS)
    if size == 1:
        return matrix, 1
    cut = len(matrix) // size * size
    return matrix[:cut].reshape(-1, size, matrix.shape[1]).mean(axis=1), size


def _search(points: np.ndarray, min_size: int) -> list[int]:
    """The cut positions (each the first point of a new segment) of ruptures' kernel
    change-point search (linear kernel) under the penalty, doubled until at most MAX_CUTS."""
    import ruptures

    n, d = points.shape
    if n < 2 * min_size:
        return []
    penalty = PENALTY_FACTOR * d * math.log(n)
    search = ruptures.KernelCPD(kernel="linear", min_size=min_size).fit(points)
    while True:
        ends = search.predict(pen=penalty)
        if len(ends) - 1 <= MAX_CUTS:
            return [int(e) for e in ends[:-1]]
        penalty *= 2


def _placed(signal: np.ndarray, low: int, cut: int, high: int, reach: int) -> int:
    """The cut within `reach` rows of `cut` that splits signal[low:high] with the least
    squared error about each side's mean (the cut of a coarse search placed to the step)."""
    best, best_cost = cut, math.inf
    part = signal[low:high]
    csum = np.cumsum(part, axis=0)
    csq = np.cumsum(part ** 2, axis=0)
    total, total_sq = csum[-1], csq[-1]
    for candidate in range(max(low + 1, cut - reach), min(high - 1, cut + reach) + 1):
        k = candidate - low
        left = (csq[k - 1] - csum[k - 1] ** 2 / k).sum()
        right_n = len(part) - k
        right = ((total_sq - csq[k - 1]) - (total - csum[k - 1]) ** 2 / right_n).sum()
        if left + right < best_cost:
            best, best_cost = candidate, left + right
    return best


def change_points(matrix: np.ndarray, min_steps: int = MIN_PHASE_STEPS) -> list[int]:
    """The row indices at which a new stretch of steady series begins (sorted; none for a
    steady run): the search of the module's docstring on `matrix` (one row per step)."""
    if len(matrix) < 2 * min_steps:
        return []
    smooth = rolling_median(matrix)
    points, size = _point_means(smooth)
    scaled = points / series_noise(points)
    cuts = _search(scaled, max(2, -(-min_steps // size)))
    if size == 1 or not cuts:
        return cuts
    signal = smooth / series_noise(smooth)
    bounds = [0, *[c * size for c in cuts], len(matrix)]
    placed = [_placed(signal, bounds[i - 1], bounds[i], bounds[i + 1], 2 * size)
              for i in range(1, len(bounds) - 1)]
    return sorted(set(placed))


@dataclass
class _Stretch:
    """Consecutive analysed steps, [first, last], and their per-step rows."""

    first: int
    last: int
    rows: pd.DataFrame

    @property
    def steps(self) -> int:
        return int(self.rows["step"].nunique())

    def waits(self) -> pd.Series:
        """Each rank's mean wait for peers over the stretch, ms (0 where not known)."""
        return self.rows.groupby("rank")["peer_wait_ns"].mean().fillna(0.0) / 1e6


def at_stake(a: _Stretch, b: _Stretch) -> tuple[bool, float]:
    """(whether a rank's mean wait differs enough between neighbours a and b: at least
    MIN_WAIT_RATIO times in one what it is in the other, a wait under NOISE_FLOOR_MS counted
    as that; the time such differences make over the shorter one's steps, summed over those
    ranks, ms), which must be at least MIN_SHARE_PCT of the run's time (summed over ranks) for
    two phases."""
    wa, wb = a.waits(), b.waits()
    ranks = wa.index.union(wb.index)
    wa, wb = wa.reindex(ranks, fill_value=0.0), wb.reindex(ranks, fill_value=0.0)
    high, low = np.maximum(wa, wb).to_numpy(), np.minimum(wa, wb).to_numpy()
    differs = high >= MIN_WAIT_RATIO * np.maximum(low, NOISE_FLOOR_MS)
    stake = (high - low) * min(a.steps, b.steps)
    return bool(differs.any()), float(np.where(differs, stake, 0.0).sum())


def stretches(per_step: pd.DataFrame, cross: CrossRank | None = None,
              fired: dict | None = None) -> list[_Stretch]:
    """The run's phases as stretches of steps: change points, then the neighbours that are not
    two phases joined, those whose difference makes the least time first. With the cross-rank
    pass's ops (`cross`), two neighbours whose waits differ are two phases only where the
    straggler rule names a late rank on the steps of one of them; `fired` keeps the rule's
    firing rows of each stretch it was applied to, by (first, last) step."""
    rows = phase_input_rows(per_step)
    if rows.empty:
        return []
    steps, matrix = step_series(rows)
    starts = [0, *change_points(matrix)]
    ends = [*starts[1:], len(steps)]

    def stretch(first: int, last: int) -> _Stretch:
        return _Stretch(first, last, rows[rows["step"].between(first, last)])

    fired = {} if fired is None else fired

    def names_late(part: _Stretch) -> bool:
        key = (part.first, part.last)
        if key not in fired:
            fired[key] = _late_on(cross, part.first, part.last, False)
        return fired[key] is not None and len(fired[key]) > 0

    judged = cross is not None and cross.ops is not None and not cross.ops.empty
    parts = [stretch(int(steps[s]), int(steps[e - 1])) for s, e in zip(starts, ends)]
    least = MIN_SHARE_PCT / 100 * float(rows["step_ns"].sum()) / 1e6
    while len(parts) > 1:
        stakes = [(ms, i) for i, (differ, ms) in enumerate(
            at_stake(a, b) for a, b in zip(parts, parts[1:])) if not (differ and ms >= least)]
        if not stakes and judged:
            stakes = [(at_stake(a, b)[1], i) for i, (a, b) in enumerate(zip(parts, parts[1:]))
                      if not (names_late(a) or names_late(b))]
        if not stakes:
            break
        i = min(stakes)[1]
        parts[i:i + 2] = [stretch(parts[i].first, parts[i + 1].last)]
    return parts


def _late_on(cross: CrossRank | None, first: int, last: int, every: bool
             ) -> pd.DataFrame | None:
    """The straggler rule's rows that fire on steps first..last alone (`every`: they are all
    the run's steps, whose rule the pass has applied), largest caused wait first; None without
    the cross-rank pass's ops."""
    if cross is None or cross.ops is None or cross.ops.empty or cross.steps.empty:
        return None
    if every:
        table = cross.stragglers
    else:
        ops = cross.ops[cross.ops["step"].between(first, last)]
        if ops.empty:
            return None
        table = find_stragglers(ops, cross.steps[cross.steps["step"].between(first, last)],
                                None, cross.clock)
    return table[table["fires"].astype(bool)] if len(table) else None


def _what_if(critical: CriticalPath | None, first: int, last: int) -> dict | None:
    """The top what-if answer on the phase's own steps (crossrank.what_if.answers_by_step), the
    first told of them as the run's are (what_if.told_order): {change, kind, ranks,
    saved_ms_per_step, predicted_step_ms, steps}; None without one that saves at least
    MIN_WAIT_MS per step."""
    if critical is None or critical.what_if_steps is None or critical.what_if_steps.empty:
        return None
    by_step = critical.what_if_steps
    mine = by_step[by_step["step"].between(first, last)]
    if mine.empty:
        return None
    candidates = []
    for answer in critical.what_if:
        column = answer["change"]
        if answer.get("kind") in NOT_PER_PHASE or column not in mine:
            continue
        saved = mine[column]
        known = saved.notna()
        if not known.any():
            continue
        mean_saved = float(saved[known].mean())
        measured = float(mine.loc[known, "measured_ms"].mean())
        candidates.append({"change": column, "kind": answer.get("kind"),
                           "ranks": list(answer.get("ranks") or []),
                           "saved_ms_per_step": round(mean_saved, 3),
                           "predicted_step_ms": round(measured - mean_saved, 3),
                           "steps": int(known.sum())})
    if not candidates:
        return None
    best = candidates[told_order(candidates)[0]]
    return best if best["saved_ms_per_step"] >= MIN_WAIT_MS else None


def find_phases(per_step: pd.DataFrame, cross: CrossRank | None = None,
                critical: CriticalPath | None = None) -> list[Phase]:
    """The run's phases in step order (one for a steady run; none without an analysed step),
    each with its steps, its share of the run's time, each rank's mean step and wait, the rank
    the straggler rule names on its steps alone and the ranks that wait for it, and the top
    what-if answer on its steps. `per_step`: the analysed (rank, step) rows with step_ns and
    peer_wait_ns; `cross`, `critical`: the run's cross-rank pass and critical path."""
    fired: dict = {}
    parts = stretches(per_step, cross, fired)
    if not parts:
        return []
    run_ns = sum(float(p.rows["step_ns"].sum()) for p in parts)
    phases = []
    for part in parts:
        ranks = {int(r): {"step_ms": float(g["step_ns"].mean() / 1e6),
                          "wait_ms": (float(g["peer_wait_ns"].mean() / 1e6)
                                      if g["peer_wait_ns"].notna().any() else None)}
                 for r, g in part.rows.groupby("rank")}
        key = (part.first, part.last)
        late = (fired[key] if key in fired and len(parts) > 1
                else _late_on(cross, part.first, part.last, len(parts) == 1))
        late_rank = int(late["rank"].iloc[0]) if late is not None and len(late) else None
        waiting = ([r for r, v in ranks.items() if r != late_rank and v["wait_ms"] is not None
                    and v["wait_ms"] >= MIN_WAIT_MS] if late_rank is not None else [])
        phases.append(Phase(
            first_step=part.first, last_step=part.last, steps=part.steps,
            share_pct=float(part.rows["step_ns"].sum()) / run_ns * 100 if run_ns else 0.0,
            step_ms=float(part.rows["step_ns"].mean() / 1e6), ranks=ranks, late_rank=late_rank,
            late_ms_per_step=(float(late["caused_wait_ms_per_step"].iloc[0])
                              if late_rank is not None else None),
            waiting_ranks=waiting, what_if=_what_if(critical, part.first, part.last)))
    return phases
