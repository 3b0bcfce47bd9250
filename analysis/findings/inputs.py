"""The step and collectives tables as the bottleneck findings read them
(analysis.findings.bottlenecks): the analysed steps, a few rows of a one-rank run's step table,
are built and read as arrays, as pandas' fixed cost per call exceeds the work on them. Every
value is the one pandas' own calls give (its sums: NaN as 0, by numpy, in the same order).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS
from analysis.rank.tables import work_ns


def analysed_steps(per_step: pd.DataFrame) -> pd.DataFrame:
    """per_step rows with a rank, a step and a positive step time: those columns and the other
    breakdown times as float64 (an absent one missing throughout, text read as numbers), and
    work_ns."""
    needed = ["rank", "step", *BREAKDOWN_NS_COLUMNS]
    if per_step.empty or any(c not in per_step.columns for c in ("rank", "step", "step_ns")):
        return pd.DataFrame(columns=[*needed, "work_ns"])
    values = {c: floats(per_step, c) if c in per_step.columns else np.full(len(per_step), np.nan)
              for c in needed}
    keep = ~np.isnan(values["rank"]) & ~np.isnan(values["step"]) & (values["step_ns"] > 0)
    steps = {c: v[keep] for c, v in values.items()}
    steps["work_ns"] = work_ns(steps)
    return pd.DataFrame(steps, index=pd.RangeIndex(int(keep.sum())))


def series_sum(values: np.ndarray):
    """Series.sum's value of a float64 array: NaN as 0, summed by numpy in the array's order."""
    missing = np.isnan(values)
    return (np.where(missing, 0.0, values) if missing.any() else values).sum()


def floats(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A column's values as float64, as pd.to_numeric(errors="coerce") reads them (a column of
    numbers as it is: the conversion would not change it)."""
    values = frame[column]
    if not pd.api.types.is_numeric_dtype(values.dtype):
        values = pd.to_numeric(values, errors="coerce")
    return values.to_numpy(dtype=np.float64, na_value=np.nan)


class RankedGroups:
    """The collectives' groups with positive total_us, ops in `exclude_ops` left out, by total_us
    (largest first, ties in table order): positions into the table, and each one's time_share
    (its total_us over their sum in table order)."""

    def __init__(self, collectives: pd.DataFrame, exclude_ops=()):
        self.table = collectives
        if collectives.empty or "total_us" not in collectives.columns:
            self.positions = np.zeros(0, dtype=np.intp)
            return
        total_us = floats(collectives, "total_us")
        keep = (total_us > 0) & ~collectives["op"].isin(exclude_ops).to_numpy(dtype=bool)
        kept = np.flatnonzero(keep)
        total = total_us[kept].sum()
        if total <= 0:
            kept = kept[:0]
        self.positions = kept[np.argsort(-total_us[kept], kind="stable")]
        self.total_us = total_us[self.positions]
        self.time_share = self.total_us / total if self.positions.size else self.total_us

    @property
    def empty(self) -> bool:
        return self.positions.size == 0

    def rows(self, count: int) -> list[dict]:
        """The first `count` groups as the dicts _collective_text and _group_label read."""
        wanted = self.positions[:count]
        columns = {c: self.table[c].to_numpy()[wanted]
                   for c in ("op", "pg", "pg_id", "size_bucket", "issuer", "count", "busbw_gbps")
                   if c in self.table.columns}
        rows = []
        for i in range(wanted.size):
            row = {c: v[i] for c, v in columns.items()}
            row.update(total_us=self.total_us[i], time_share=self.time_share[i])
            rows.append(row)
        return rows


def ddp_buckets(collectives: pd.DataFrame) -> dict | None:
    """DDP's gradient buckets as the collectives table shows them: {"per_step": all-reduces
    issued by DDP per (rank, step), "bytes": their mean size or None}; None where the table
    has no DDP all-reduce with a count and its (rank, step) pairs."""
    needed = ("op", "issuer", "count", "rank_steps")
    if collectives is None or collectives.empty or any(c not in collectives for c in needed):
        return None
    ddp = collectives[(collectives["op"] == "all_reduce") & (collectives["issuer"] == "ddp")]
    counts, rank_steps = floats(ddp, "count"), floats(ddp, "rank_steps")
    if ddp.empty or not np.nansum(counts) > 0 or not np.nanmax(rank_steps) > 0:
        return None
    size = None
    if "total_bytes" in ddp.columns:
        total = floats(ddp, "total_bytes")
        known = ~np.isnan(total) & (counts > 0)
        if known.any():
            size = float(total[known].sum() / counts[known].sum())
    return {"per_step": float(np.nansum(counts) / np.nanmax(rank_steps)), "bytes": size}


def input_shapes_vary(traces) -> bool | None:
    """Whether the traced input shapes vary between steps: True where some op's set of input
    shapes (the profiler's record_shapes) differs between two steps of one rank; False where
    shapes were traced in two steps or more and never differ; None where no trace holds shapes
    in two steps (no evidence either way)."""
    seen = False
    for trace in traces or []:
        events, steps = getattr(trace, "events", None), getattr(trace, "steps", None)
        if (events is None or steps is None or len(events) == 0 or len(steps) < 2
                or "input_dims" not in events.columns):
            continue
        dims = events["input_dims"].astype(object).where(events["input_dims"].notna(), "")
        dims = dims.astype(str)
        shaped = ((dims != "") & (dims != "[]")).to_numpy()
        if not shaped.any():
            continue
        starts = steps["start_ns"].to_numpy(dtype=np.int64)
        ends = steps["end_ns"].to_numpy(dtype=np.int64)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        at = events["ts_ns"].to_numpy(dtype=np.int64)[shaped]
        index = np.searchsorted(starts, at, side="right") - 1
        inside = (index >= 0) & (at < ends[np.clip(index, 0, None)])
        if len(np.unique(index[inside])) < 2:
            continue
        seen = True
        table = pd.DataFrame({"name": events["name"].astype(str).to_numpy()[shaped][inside],
                              "step": index[inside], "dims": dims.to_numpy()[shaped][inside]})
        per_step = table.groupby(["name", "step"])["dims"].agg(lambda s: tuple(sorted(set(s))))
        if (per_step.groupby(level="name").nunique() > 1).any():
            return True
    return False if seen else None
