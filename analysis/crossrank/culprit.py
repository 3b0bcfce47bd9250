"""Culprit and victims: which rank the others waited for, how long, and what it was doing.

Per matched instance the last member to arrive caused the others' waits (their wait_for_peers),
passed along waiting chains to the rank it was itself waiting for (crossrank.blame); a rank's
caused wait is summed over instances. A rank is named a straggler only when its caused
wait is large against step time, steady from step to step and well above any other rank's
(thresholds below; definitions in docs/cross-rank.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import intervals
from analysis.communication import size_bucket
from analysis.crossrank.blame import blame

STRAGGLER_COLUMNS = ["rank", "caused_wait_ms_per_step", "share_pct", "steady", "dominant",
                     "fires", "collectives", "evidence"]
MIN_SHARE_PCT = 5.0  # the caused wait is at least this share of the ranks' summed step time
STEADY_FRACTION = 0.5  # in 3 of 4 steps (lower quartile) at least half the median caused wait
DOMINANCE = 2.0  # ... and >= 2 x any other rank's median caused wait per step
# ... and each waiting member waited longer than the ops' transfer (see find_stragglers)
TOP_COLLECTIVES = 3
TOP_OPS = 5
MAX_WINDOWS = 500  # evidence windows examined per straggler, the longest first


def _robust(per_step: pd.DataFrame) -> pd.DataFrame:
    by_rank = per_step.groupby("culprit")["caused_ns"]
    return pd.DataFrame({"median": by_rank.median(), "low": by_rank.quantile(0.25)})


def caused_waits(waits: pd.DataFrame) -> pd.DataFrame:
    """Per instance and rank charged with its waits (`culprit`, blame along waiting chains):
    the instance's last arriver, step, op, group, bytes and the wait charged (`caused_ns`)."""
    culprit_rows = waits[waits["rank"] == waits["last_rank"]].drop_duplicates("instance")
    transfer = waits.groupby("instance")["transfer_ns"].max().rename("transfer_ns")
    first = waits.groupby("instance")["arrival_ns"].min().rename("first_arrival_ns")
    instances = culprit_rows.set_index("instance")[
        ["last_rank", "step", "op", "pg", "bytes", "arrival_ns", "end_ns"]
    ].join([first, transfer])
    charged = blame(waits).set_index("instance")
    return charged.join(instances, how="inner").rename_axis("instance").reset_index()


def find_stragglers(waits: pd.DataFrame, steps: pd.DataFrame, events: dict | None = None,
                    clock: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per rank that caused any wait, ordered by caused wait; `fires` marks those that
    pass every threshold (the "ranks wait for rank R" finding)."""
    if waits.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    instances = caused_waits(waits)
    step_numbers = np.sort(steps["step"].unique()) if len(steps) else np.sort(
        waits["step"].unique())
    step_ns = float((steps["end_ns"] - steps["start_ns"]).sum()) if len(steps) else np.nan
    culprits = sorted(instances.loc[instances["caused_ns"] > 0, "culprit"].unique())
    grid = pd.MultiIndex.from_product([culprits, step_numbers], names=["culprit", "step"])
    per_step = (instances.groupby(["culprit", "step"])["caused_ns"].sum()
                .reindex(grid, fill_value=0).reset_index())
    stats = _robust(per_step)
    rows = []
    for rank in culprits:
        total = float(instances.loc[instances["culprit"] == rank, "caused_ns"].sum())
        median, low = stats.loc[rank, "median"], stats.loc[rank, "low"]
        others = stats.drop(index=rank)["median"]
        share = total / step_ns * 100 if step_ns > 0 else np.nan
        steady = median > 0 and low >= STEADY_FRACTION * median
        dominant = median >= DOMINANCE * (others.max() if len(others) else 0.0)
        mine = instances[instances["culprit"] == rank]
        # Each waiting member's wait against the op's own transfer: waiting for R must cost
        # more than the collective itself, or R's lateness is within the op's own noise.
        waiters = max(len(set(waits["rank"])) - 1, 1)
        material = total / waiters >= float(mine.loc[mine["caused_ns"] > 0, "transfer_ns"].sum())
        rows.append({
            "rank": int(rank), "caused_wait_ms_per_step": total / len(step_numbers) / 1e6,
            "share_pct": share, "steady": bool(steady), "dominant": bool(dominant),
            "fires": bool(share >= MIN_SHARE_PCT and steady and dominant and material),
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
    return times + np.rint(row["offset_ns"] + row["drift_ns_per_s"] / 1e9 * (times - t0)
                           ).astype("int64")


def _evidence(mine: pd.DataFrame, rank: int, events: dict | None, clock, steps: int) -> dict:
    """What `rank` did in the windows the others waited for it: [first arrival, its arrival)."""
    windows = mine[mine["caused_ns"] > 0].nlargest(MAX_WINDOWS, "caused_ns")
    starts = _own_clock(windows["first_arrival_ns"].to_numpy(), rank, clock)
    ends = _own_clock(windows["arrival_ns"].to_numpy(), rank, clock)
    window_ns = intervals.total(starts, ends)
    evidence = {"windows": int(len(windows)), "window_ms_per_step": window_ns / max(steps, 1) / 1e6,
                "traced_windows": 0, "top_ops": [], "data_loading_ms": None,
                "outside_ops_ms": None}
    trace = (events or {}).get(rank)
    if trace is None or trace.empty:
        return evidence
    # Only the windows the trace covers can be explained (a profiler window is a few steps).
    inside = (starts >= trace["ts_ns"].min()) & (ends <= trace["end_ns"].max())
    starts, ends = starts[inside], ends[inside]
    evidence["traced_windows"] = int(inside.sum())
    window_ns = intervals.total(starts, ends)
    host = trace[~trace["is_gpu"].astype(bool) & trace["cat"].isin(["cpu_op", "user_annotation"])
                 & ~trace["name"].astype(str).str.startswith("ProfilerStep#")]
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
