"""Culprit and victims: which rank the others waited for, how long, and what it was doing.

Per matched instance the last member to arrive caused the others' waits (their wait_for_peers),
passed along waiting chains to the rank it was itself waiting for (crossrank.blame); a rank's
caused wait is summed over instances. A rank is named a straggler only when its caused
wait is large against step time, steady from step to step, made it the step's main culprit in
more steps than chance allows, and longer than the ops' own transfer (thresholds below;
definitions in docs/cross-rank.md).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.crossrank.blame import blame
from analysis.rank.comm.comm_ops import size_bucket

STRAGGLER_COLUMNS = ["rank", "caused_wait_ms_per_step", "share_pct", "clean_steps",
                     "top_steps", "chance", "steady", "significant", "material", "fires",
                     "too_few_steps", "collectives", "evidence"]
MIN_SHARE_PCT = 5.0  # the caused wait is at least this share of the ranks' summed step time
STEADY_FRACTION = 0.5  # a step counts as late when R caused at least half its median ...
STEADY_STEPS = 0.75  # ... in at least this fraction of the clean steps
MIN_STEPS = 5  # clean steps needed before any rank is named
CHANCE_LEVEL = 1e-3  # R was the step's main culprit more often than a fair draw explains
# The tracer's own work between two steps (profiler start, window switch, trace export) delays
# a rank's next arrivals by up to that long: a step whose main culprit's lateness it could
# explain (wait per waiting member at most this many times the longest such gap) is left out.
TRACER_GAP_FACTOR = 2.0
TOP_COLLECTIVES = 3
TOP_OPS = 5
MAX_WINDOWS = 500  # evidence windows examined per straggler, the longest first


def tracer_gaps(steps: pd.DataFrame) -> pd.Series:
    """Per step: the longest time any rank's tracer worked before it (the gap between the
    rank's previous step's end and the step's start; 0 where the previous step is unknown)."""
    if steps is None or steps.empty:
        return pd.Series(dtype="float64")
    ordered = steps.sort_values(["rank", "step"])
    previous_end = ordered.groupby("rank")["end_ns"].shift(1)
    follows = ordered["step"] - ordered.groupby("rank")["step"].shift(1) == 1
    gap = (ordered["start_ns"] - previous_end).where(follows, 0).clip(lower=0)
    return gap.groupby(ordered["step"]).max().astype("float64")


def clean_steps(per_step: pd.DataFrame, gaps: pd.Series, waiters: int) -> list:
    """The steps of `per_step` (caused wait per step and culprit) but the first (warm-up: lazy
    initialisation, first-time code paths) and those whose main culprit's wait per waiting
    member the tracer's own work before the step could explain."""
    later = per_step.iloc[1:]
    top_wait = later.max(axis=1) / max(waiters, 1) if later.shape[1] else later.sum(axis=1)
    gap = gaps.reindex(later.index).fillna(0)
    return list(later.index[~(top_wait <= TRACER_GAP_FACTOR * gap) | (gap == 0)])


def chance_of(top_steps: int, steps: int, members: int) -> float:
    """The chance that one of `members` ranks, each equally likely per step, is the step's main
    culprit in `top_steps` or more of `steps` steps (the binomial tail)."""
    p = 1.0 / max(members, 1)
    if p >= 1.0:  # one member: the culprit of every step
        return 1.0 if top_steps <= steps else 0.0
    # Each term in logarithms: math.comb(steps, k) overflows a float past about 1,030 steps.
    log_p, log_q = math.log(p), math.log1p(-p)
    return min(1.0, math.fsum(
        math.exp(math.lgamma(steps + 1) - math.lgamma(k + 1) - math.lgamma(steps - k + 1)
                 + k * log_p + (steps - k) * log_q)
        for k in range(max(top_steps, 0), steps + 1)))


def steps_needed(members: int) -> int:
    """Clean steps in which one rank must be the main culprit every time to be named among
    `members` ranks (MIN_STEPS and CHANCE_LEVEL); the traced steps need one more (warm-up)."""
    steps = MIN_STEPS
    while chance_of(steps, steps, members) >= CHANCE_LEVEL:
        steps += 1
    return steps


def caused_waits(waits: pd.DataFrame) -> pd.DataFrame:
    """Per instance and rank charged with its waits (`culprit`, blame along waiting chains):
    the instance's last arriver, step, op, group, bytes, the members that waited (`waiters`)
    and the wait charged (`caused_ns`)."""
    culprit_rows = waits[waits["rank"] == waits["last_rank"]].drop_duplicates("instance")
    transfer = waits.groupby("instance")["transfer_ns"].max().rename("transfer_ns")
    first = waits.groupby("instance")["arrival_ns"].min().rename("first_arrival_ns")
    waiters = (waits["wait_ns"] > 0).groupby(waits["instance"]).sum().rename("waiters")
    instances = culprit_rows.set_index("instance")[
        ["last_rank", "step", "op", "pg", "bytes", "arrival_ns", "end_ns"]
    ].join([first, transfer, waiters])
    charged = blame(waits).set_index("instance")
    return charged.join(instances, how="inner").rename_axis("instance").reset_index()


def find_stragglers(waits: pd.DataFrame, steps: pd.DataFrame, events: dict | None = None,
                    clock: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per rank that caused any wait, ordered by caused wait; `fires` marks those that
    pass every threshold (the "ranks wait for rank R" finding). `events`: {rank: its host ops
    (analysis.rank.step_evidence.HostSpans, on the clock of its ops)}, for a named straggler's
    evidence."""
    if waits.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    instances = caused_waits(waits)
    step_numbers = np.sort(steps["step"].unique()) if len(steps) else np.sort(
        waits["step"].unique())
    step_ns = float((steps["end_ns"] - steps["start_ns"]).sum()) if len(steps) else np.nan
    culprits = sorted(instances.loc[instances["caused_ns"] > 0, "culprit"].unique())
    evidence = np.intersect1d(step_numbers, waits["step"].unique())
    members = len(set(waits["rank"]))
    per_step = (instances.pivot_table(index="step", columns="culprit", values="caused_ns",
                                      aggfunc="sum")
                .reindex(index=evidence, columns=culprits).fillna(0.0))
    clean = clean_steps(per_step, tracer_gaps(steps), members - 1)
    per_step = per_step.loc[clean]
    # The step's main culprit: the rank charged with the most wait in it (none if nobody was).
    top = per_step.idxmax(axis=1).where(per_step.max(axis=1) > 0) if len(culprits) else None
    rows = []
    for rank in culprits:
        total = float(instances.loc[instances["culprit"] == rank, "caused_ns"].sum())
        mine_per_step = per_step[rank].to_numpy() if len(clean) else np.zeros(0)
        median = float(np.median(mine_per_step)) if len(mine_per_step) else 0.0
        late = int((mine_per_step >= STEADY_FRACTION * median).sum()) if median > 0 else 0
        top_steps = int((top == rank).sum()) if top is not None else 0
        chance = chance_of(top_steps, len(clean), members)
        steady = len(clean) >= MIN_STEPS and late >= STEADY_STEPS * len(clean)
        significant = len(clean) >= MIN_STEPS and chance < CHANCE_LEVEL
        share = total / step_ns * 100 if step_ns > 0 else np.nan
        mine = instances[(instances["culprit"] == rank) & (instances["caused_ns"] > 0)]
        # Waiting for R must cost more than the collectives themselves, or R's lateness is
        # within the ops' own noise: each instance's transfer counts once per waiting member.
        material = total >= float((mine["transfer_ns"] * mine["waiters"]).sum())
        fires = bool(share >= MIN_SHARE_PCT and steady and significant and material)
        rows.append({
            "rank": int(rank), "caused_wait_ms_per_step": total / len(step_numbers) / 1e6,
            "share_pct": share, "clean_steps": len(clean), "top_steps": top_steps,
            "chance": chance, "steady": bool(steady), "significant": bool(significant),
            "material": bool(material), "fires": fires,
            # Last in every clean step, and material, but in too few steps to rule out chance.
            "too_few_steps": bool(not fires and not significant and share >= MIN_SHARE_PCT
                                  and material and 0 < top_steps == len(clean)),
            "collectives": _collectives_text(mine), "evidence": None,
        })
    table = pd.DataFrame(rows, columns=STRAGGLER_COLUMNS)
    # What a rank did while the others waited is read from its trace only where it is named.
    table["evidence"] = [
        _evidence(instances[(instances["culprit"] == rank) & (instances["last_rank"] == rank)],
                  rank, events, clock,
                  len(step_numbers)) if fires else None
        for rank, fires in zip(table["rank"], table["fires"])]
    return table.sort_values("caused_wait_ms_per_step", ascending=False,
                             kind="stable").reset_index(drop=True)


def _collectives_text(mine: pd.DataFrame) -> list:
    labelled = mine.assign(bucket=mine["bytes"].map(lambda b: size_bucket(b)[0]))
    top = (labelled.groupby(["op", "pg", "bucket"])["caused_ns"].agg(["sum", "size"])
           .sort_values("sum", ascending=False).head(TOP_COLLECTIVES))
    return [{"op": op, "pg": pg, "size_bucket": bucket, "caused_wait_ms": row["sum"] / 1e6,
             "instances": int(row["size"])} for (op, pg, bucket), row in top.iterrows()]


def _own_clock(times: np.ndarray, rank: int, clock: pd.DataFrame | None) -> np.ndarray:
    if clock is None or clock.empty or rank not in set(clock["rank"]):
        return times
    row = clock.set_index("rank").loc[rank]
    t0 = clock.attrs.get("t0", 0)
    drift = float(np.nan_to_num(row["drift_ns_per_s"])) / 1e9  # NaN: none fitted, none applied
    return times + np.rint(row["offset_ns"] + drift * (times - t0)).astype("int64")


def _evidence(mine: pd.DataFrame, rank: int, events: dict | None, clock, steps: int) -> dict:
    """What `rank` did in the windows the others waited for it: [first arrival, its arrival)."""
    windows = mine[mine["caused_ns"] > 0].nlargest(MAX_WINDOWS, "caused_ns")
    starts = _own_clock(windows["first_arrival_ns"].to_numpy(), rank, clock)
    ends = _own_clock(windows["arrival_ns"].to_numpy(), rank, clock)
    window_ns = intervals.total(starts, ends)
    evidence = {"windows": int(len(windows)), "window_ms_per_step": window_ns / max(steps, 1) / 1e6,
                "traced_windows": 0, "top_ops": [], "data_loading_ms": None,
                "outside_ops_ms": None}
    spans = (events or {}).get(rank)
    if spans is None or spans.first_ns is None:
        return evidence
    # Only the windows the trace covers can be explained (a profiler window is a few steps).
    inside = (starts >= spans.first_ns) & (ends <= spans.last_ns)
    starts, ends = starts[inside], ends[inside]
    evidence["traced_windows"] = int(inside.sum())
    window_ns = intervals.total(starts, ends)
    host = spans.ops
    host = host[(host["end_ns"] > starts.min()) & (host["ts_ns"] < ends.max())] if len(
        starts) else host.iloc[:0]
    names, time = [], []
    for start, end in zip(*intervals.union(starts, ends)):
        inside = host[(host["end_ns"] > start) & (host["ts_ns"] < end)]
        overlap = (np.minimum(inside["end_ns"], end) - np.maximum(inside["ts_ns"], start))
        names.append(inside["name"].astype(str).to_numpy())
        time.append(overlap.to_numpy())
    if not names or not sum(len(n) for n in names):
        evidence["outside_ops_ms"] = window_ns / 1e6
        return evidence
    overlaps = pd.Series(np.concatenate(time), index=np.concatenate(names))
    by_name = overlaps.groupby(level=0).sum().sort_values(ascending=False)
    evidence["top_ops"] = [{"name": n, "ms": t / 1e6} for n, t in by_name.head(TOP_OPS).items()]
    loading = by_name[by_name.index.str.contains("DataLoader|dataloader")].sum()
    evidence["data_loading_ms"] = float(loading) / 1e6
    in_ops = host[(host["end_ns"] > starts.min())]
    covered = 0
    for start, end in zip(*intervals.union(starts, ends)):
        inside = in_ops[(in_ops["end_ns"] > start) & (in_ops["ts_ns"] < end)]
        covered += intervals.total(np.maximum(inside["ts_ns"], start),
                                   np.minimum(inside["end_ns"], end))
    evidence["outside_ops_ms"] = (window_ns - covered) / 1e6
    return evidence
