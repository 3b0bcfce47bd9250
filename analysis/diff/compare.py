"""Comparing two sides (analysis.diff.side) table by table: verdict, categories, operators and
kernels, collectives, memory and samples, findings, pipeline bubbles, the critical path and
whether it moved; ranks matched by their role (docs/diff.md). Pure: frames in, frames out."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.diff import operators as diff_ops
from analysis.diff import side as diff_side
from analysis.diff import stats as diff_stats

MS = 1e6
TOP_OPS = 15
# A finding present in both runs is "changed" when its share of step time moved this much.
CHANGED_SHARE_PP = 1.0
EVERY_RANK = "every rank (mean)"


# ---- roles ---------------------------------------------------------------------------------------
def roles(layout_a: dict, layout_b: dict) -> tuple[dict, dict, str | None]:
    """{rank: role} for each side and a note where ranks could not be matched one to one.
    A rank without a role on either side is not compared rank by rank."""
    ranks_a, ranks_b = layout_a["ranks"], layout_b["ranks"]
    if layout_a["kind"] != layout_b["kind"]:
        return {}, {}, (f"A is {_layout_text(layout_a)}, B is {_layout_text(layout_b)}: their "
                        f"ranks do different work, so only run-wide figures are compared")
    if ranks_a == ranks_b and layout_a["world_size"] == layout_b["world_size"]:
        return ({r: f"rank {r}" for r in ranks_a}, {r: f"rank {r}" for r in ranks_b}, None)
    if layout_a["kind"] != "pipeline":
        return ({r: EVERY_RANK for r in ranks_a}, {r: EVERY_RANK for r in ranks_b},
                f"the runs have different ranks (A {_ranks_text(layout_a)}, B "
                f"{_ranks_text(layout_b)}); data/tensor-parallel ranks do the same work, so each "
                f"side's ranks are compared as their mean")
    if len(ranks_a) == len(ranks_b):
        return ({r: f"stage {i}" for i, r in enumerate(ranks_a)},
                {r: f"stage {i}" for i, r in enumerate(ranks_b)}, None)
    note = (f"A has {len(ranks_a)} pipeline stages, B {len(ranks_b)}: the first and last "
            f"stages are compared; the middle stages have no counterpart")
    return _ends(ranks_a), _ends(ranks_b), note


def _ends(ranks: list) -> dict:
    return {ranks[0]: "first stage", ranks[-1]: "last stage"} if len(ranks) > 1 else {}


def _layout_text(layout: dict) -> str:
    if layout["kind"] == "pipeline":
        return f"a pipeline of {layout['stages']} stages"
    return f"{layout['kind']} over {len(layout['ranks'])} rank(s)"


def _ranks_text(layout: dict) -> str:
    world = f" of {layout['world_size']}" if layout["world_size"] else ""
    return f"{','.join(map(str, layout['ranks'])) or 'none'}{world}"


def _by_role(frame: pd.DataFrame, role_of: dict, weights: str | None = None,
             how: str = "mean") -> pd.DataFrame:
    """The frame's numeric columns per role (mean, weighted by `weights`, or max)."""
    frame = frame[frame["rank"].isin(role_of.keys())]
    frame = frame.assign(role=frame["rank"].map(role_of)).drop(columns="rank")
    values = [c for c in frame.columns if c not in ("role", weights)]
    if frame.empty:
        return pd.DataFrame(columns=["role", *values])
    if how == "max":
        return frame.groupby("role", sort=False)[values].max().reset_index()
    weight = frame[weights] if weights else pd.Series(1.0, index=frame.index)
    present = frame[values].notna()
    sums = frame[values].mul(weight, axis=0).assign(role=frame["role"]).groupby(
        "role", sort=False).sum(min_count=1)
    counts = present.mul(weight, axis=0).assign(role=frame["role"]).groupby(
        "role", sort=False).sum()
    return (sums / counts.replace(0, np.nan)).reset_index()


def _long(a: pd.DataFrame, b: pd.DataFrame, metrics: list, name: str) -> pd.DataFrame:
    """One row per (role, metric): a, b, delta = b - a; rows missing on both sides dropped."""
    rows = []
    roles_in_order = list(dict.fromkeys([*a["role"], *b["role"]]))
    a, b = a.set_index("role"), b.set_index("role")
    for role in roles_in_order:
        for metric in metrics:
            value_a = a[metric].get(role, np.nan) if metric in a.columns else np.nan
            value_b = b[metric].get(role, np.nan) if metric in b.columns else np.nan
            if pd.isna(value_a) and pd.isna(value_b):
                continue
            rows.append({"role": role, name: metric, "a": value_a, "b": value_b,
                         "delta": value_b - value_a})
    return pd.DataFrame(rows, columns=["role", name, "a", "b", "delta"])


# ---- tables --------------------------------------------------------------------------------------
def category_deltas(a: pd.DataFrame, b: pd.DataFrame, role_a: dict, role_b: dict
                    ) -> pd.DataFrame:
    """role, category, a, b, delta in mean ms per step (diff_side.categories)."""
    return _long(_by_role(a, role_a, "steps"), _by_role(b, role_b, "steps"),
                 diff_side.CATEGORIES, "category")


def operator_deltas(a: pd.DataFrame, a_steps: int, b: pd.DataFrame, b_steps: int,
                    top: int = TOP_OPS) -> pd.DataFrame:
    """kind, key, name, path and per rank-step calls and ms (self and total) in A and B, the
    `top` largest self-time changes of each kind."""
    a, b = diff_ops.keyed(a, b)
    sides = []
    for frame, steps, suffix in ((a, a_steps, "a"), (b, b_steps, "b")):
        grouped = frame.groupby(["kind", "key"], sort=True).agg(
            name=("name", "first"), path=("path", lambda p: p.iloc[0] if p.nunique() == 1
                                          else ""),
            calls=("calls", "sum"), total_ns=("total_ns", "sum"), self_ns=("self_ns", "sum"))
        scale = 1 / steps if steps else np.nan
        sides.append(pd.DataFrame({
            "name": grouped["name"], "path": grouped["path"],
            f"calls_{suffix}": grouped["calls"] * scale,
            f"self_ms_{suffix}": grouped["self_ns"] * scale / MS,
            f"total_ms_{suffix}": grouped["total_ns"] * scale / MS}))
    merged = sides[0].merge(sides[1], how="outer", left_index=True, right_index=True,
                            suffixes=("", "_b"))
    merged["name"] = merged["name"].fillna(merged.pop("name_b"))
    merged["path"] = merged["path"].fillna(merged.pop("path_b"))
    for column in ("calls", "self_ms", "total_ms"):
        merged[[f"{column}_a", f"{column}_b"]] = merged[[f"{column}_a", f"{column}_b"]].fillna(0.0)
        merged[f"{column}_delta"] = merged[f"{column}_b"] - merged[f"{column}_a"]
    merged = merged.reset_index()
    merged["size"] = merged["self_ms_delta"].abs()
    merged = merged.sort_values(["kind", "size", "key"], ascending=[False, False, True],
                                kind="stable")
    return merged.groupby("kind", sort=False).head(top).drop(columns="size").reset_index(
        drop=True)


def collective_deltas(a: pd.DataFrame, a_steps: int, b: pd.DataFrame, b_steps: int
                      ) -> pd.DataFrame:
    """op, size_bucket, and per side the ops and bytes per rank-step and the busbw (bus bytes
    over the time of the ops with a known size, time and group size), with deltas."""
    sides = []
    for frame, steps, suffix in ((a, a_steps, "a"), (b, b_steps, "b")):
        frame = frame.set_index(["op", "size_bucket"])
        scale = 1 / steps if steps else np.nan
        time_s = frame["time_us"].astype(float) / 1e6
        sides.append(pd.DataFrame({
            "bucket_min_bytes": frame["bucket_min_bytes"],
            f"count_{suffix}": frame["count"].astype(float) * scale,
            f"bytes_{suffix}": frame["bytes"].astype(float) * scale,
            f"busbw_gbps_{suffix}": (frame["bus_bytes"].astype(float) / time_s / 1e9).where(
                time_s > 0)}, index=frame.index))
    merged = sides[0].merge(sides[1], how="outer", left_index=True, right_index=True,
                            suffixes=("", "_b"))
    merged["bucket_min_bytes"] = merged["bucket_min_bytes"].fillna(merged.pop("bucket_min_bytes_b"))
    for column in ("count", "bytes"):
        merged[[f"{column}_a", f"{column}_b"]] = merged[[f"{column}_a", f"{column}_b"]].fillna(0.0)
        merged[f"{column}_delta"] = merged[f"{column}_b"] - merged[f"{column}_a"]
    merged["busbw_gbps_delta"] = merged["busbw_gbps_b"] - merged["busbw_gbps_a"]
    merged = merged.reset_index().sort_values(["op", "bucket_min_bytes"], kind="stable")
    return merged.reset_index(drop=True)


def resource_deltas(a: pd.DataFrame, b: pd.DataFrame, role_a: dict, role_b: dict
                    ) -> pd.DataFrame:
    """role, metric, a, b, delta: memory peaks (the largest of the role's ranks) and sample
    averages (their mean)."""
    peaks = _long(_by_role(a[["rank", *diff_side.RESOURCE_PEAKS]], role_a, how="max"),
                  _by_role(b[["rank", *diff_side.RESOURCE_PEAKS]], role_b, how="max"),
                  diff_side.RESOURCE_PEAKS, "metric")
    means = _long(_by_role(a[["rank", *diff_side.RESOURCE_MEANS]], role_a),
                  _by_role(b[["rank", *diff_side.RESOURCE_MEANS]], role_b),
                  diff_side.RESOURCE_MEANS, "metric")
    return pd.concat([peaks, means], ignore_index=True)


def finding_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """finding, status (new, gone, changed, unchanged), share in A and B, ranks, evidence. A
    finding is new or gone by its presence, not its share: some carry none (ranks train alone,
    memory near capacity)."""
    merged = a.set_index("finding").merge(b.set_index("finding"), how="outer",
                                          left_index=True, right_index=True,
                                          suffixes=("_a", "_b"))
    delta = merged["share_pct_b"] - merged["share_pct_a"]
    in_a, in_b = merged.index.isin(a["finding"]), merged.index.isin(b["finding"])
    status = np.where(~in_a, "new",
                      np.where(~in_b, "gone",
                               np.where((delta.abs() >= CHANGED_SHARE_PP)
                                        | (merged["ranks_a"] != merged["ranks_b"]),
                                        "changed", "unchanged")))
    table = merged.assign(status=status, share_pct_delta=delta).reset_index()
    order = {"new": 0, "gone": 1, "changed": 2, "unchanged": 3}
    table = table.sort_values("status", key=lambda s: s.map(order), kind="stable")
    return table[["finding", "status", "share_pct_a", "share_pct_b", "share_pct_delta",
                  "ranks_a", "ranks_b", "evidence_a", "evidence_b"]].reset_index(drop=True)


def pipeline_deltas(a: pd.DataFrame, b: pd.DataFrame, role_a: dict, role_b: dict
                    ) -> pd.DataFrame:
    """role, metric (measured/theory bubble, recv wait, in % of step time), a, b, delta."""
    metrics = ["measured_bubble_pct", "theory_bubble_pct", "recv_wait_pct"]
    return _long(_by_role(a, role_a), _by_role(b, role_b), metrics, "metric")


def critical_path_deltas(a: pd.DataFrame, b: pd.DataFrame, role_a: dict, role_b: dict
                         ) -> pd.DataFrame:
    """role, category, a, b, delta: the critical path's mean ms per analysed step
    (diff_side.critical_path) by role and category, a role of several ranks their sum (the
    path's time on any of them), 0 where a side's path does not pass (missing where a side has
    no path); the largest first by the larger side."""
    columns = ["role", "category", "a", "b", "delta"]
    sides = []
    for frame, role_of in ((a, role_a), (b, role_b)):
        frame = frame[frame["rank"].isin(role_of.keys())]
        sides.append(frame.assign(role=frame["rank"].map(role_of)).groupby(
            ["role", "category"], sort=False)["ms"].sum())
    table = pd.concat(sides, axis=1, keys=["a", "b"]) if any(len(s) for s in sides) else None
    if table is None or table.empty:
        return pd.DataFrame(columns=columns)
    table = table.astype("float64").reset_index()
    for side, values in zip(("a", "b"), sides):
        if len(values):
            table[side] = table[side].fillna(0.0)
    table["delta"] = table["b"] - table["a"]
    larger = table[["a", "b"]].max(axis=1)
    order = larger.sort_values(ascending=False, kind="stable").index
    return table.loc[order, columns].reset_index(drop=True)


def critical_path_line(table: pd.DataFrame) -> str | None:
    """Whether the critical path moved: its largest part (role and category, mean ms per
    analysed step) in A against B's. "the critical path moved from rank 1 compute (39.00 ms
    per step) to rank 0 transfer (12.00 ms per step)", or "stayed on ..."; None where neither
    side has a path, and a line saying which side lacks one where one does."""
    if table is None or table.empty:
        return None
    tops = []
    for side in ("a", "b"):
        known = table[side].dropna()
        tops.append(table.loc[known.idxmax()] if len(known) else None)
    top_a, top_b = tops
    if top_a is None or top_b is None:
        lacking = "A" if top_a is None else "B"
        return f"the critical path is not known in {lacking}: nothing to compare it with"
    where_a = f"{top_a['role']} {top_a['category']}"
    where_b = f"{top_b['role']} {top_b['category']}"
    if where_a == where_b:
        return (f"the critical path stayed on {where_a} ({top_a['a']:.2f} \u2192 {top_b['b']:.2f} "
                f"ms per step)")
    return (f"the critical path moved from {where_a} ({top_a['a']:.2f} ms per step in A) to "
            f"{where_b} ({top_b['b']:.2f} ms per step in B)")


def phases_line(phases_a: list[list], phases_b: list[list]) -> str | None:
    """Whether either side's runs have several phases (docs/definitions.md, "Phases"): "A:
    one phase; B: 2 phases, changed at step 2000 (from step 2000 rank 1 late by 61.91 ms per
    step)", the first run of several phases of each side described; None where every run of
    both sides has one phase (or none)."""
    if all(len(p) <= 1 for p in [*phases_a, *phases_b]):
        return None
    return "; ".join(f"{label}: {_phases_text(runs)}"
                     for label, runs in (("A", phases_a), ("B", phases_b)))


def _phases_text(runs: list[list]) -> str:
    several = [p for p in runs if len(p) > 1]
    if not several:
        return "one phase" + ("" if len(runs) <= 1 else " in each run")
    phases = several[0]
    late = [f"from step {p.first_step} rank {p.late_rank} late by {p.late_ms_per_step:.2f} ms "
            f"per step" for p in phases if p.late_rank is not None]
    runs_text = "" if len(runs) == 1 else f" in {len(several)} of its {len(runs)} runs"
    return (f"{len(phases)} phases{runs_text}, changed at step"
            f"{'s' if len(phases) > 2 else ''} {', '.join(str(p.first_step) for p in phases[1:])}"
            + (f" ({'; '.join(late)})" if late else ""))


def compare(a: diff_side.Side, b: diff_side.Side, seed: int = diff_stats.DEFAULT_SEED,
            resamples: int = diff_stats.DEFAULT_RESAMPLES, top: int = TOP_OPS,
            noise_floor_pct: float = diff_stats.DEFAULT_NOISE_FLOOR_PCT) -> dict:
    """Every table of the comparison (docs/diff.md)."""
    layout_a, layout_b = diff_side.layout(a), diff_side.layout(b)
    role_a, role_b, note = roles(layout_a, layout_b)
    if not role_a and not role_b:
        role_a = dict.fromkeys(layout_a["ranks"], EVERY_RANK)
        role_b = dict.fromkeys(layout_b["ranks"], EVERY_RANK)
    change = diff_stats.bootstrap_change(diff_side.step_times(a), diff_side.step_times(b),
                                         seed, resamples, noise_floor_pct)
    ops_a, ops_b = diff_side.operators(a), diff_side.operators(b)
    comm_a, comm_b = diff_side.collectives(a), diff_side.collectives(b)
    path = critical_path_deltas(diff_side.critical_path(a), diff_side.critical_path(b),
                                role_a, role_b)
    phases = {"a": diff_side.phases(a), "b": diff_side.phases(b)}
    return {
        "change": change, "verdict": diff_stats.verdict_text(change),
        "coverage": diff_stats.coverage_text(change),
        "layout": {"a": layout_a, "b": layout_b, "note": note},
        "categories": category_deltas(diff_side.categories(a), diff_side.categories(b),
                                      role_a, role_b),
        "operators": operator_deltas(*ops_a, *ops_b, top=top),
        "collectives": collective_deltas(*comm_a, *comm_b),
        "resources": resource_deltas(diff_side.resources(a), diff_side.resources(b),
                                     role_a, role_b),
        "findings": finding_changes(diff_side.findings(a), diff_side.findings(b)),
        "pipeline": pipeline_deltas(diff_side.pipeline(a), diff_side.pipeline(b),
                                    role_a, role_b),
        "critical_path": path,
        "critical_path_line": critical_path_line(path),
        "phases": phases, "phases_line": phases_line(phases["a"], phases["b"]),
        "problems": [*a.problems, *b.problems],
    }
