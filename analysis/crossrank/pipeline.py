"""Pipeline bubbles per stage: recv wait, p2p transfer and idle, against the schedule's theory.

A stage's bubble is its step time minus its own work; recv wait and transfer come from its
matched p2p ops, idle is the rest. Theory: (p-1)/(v*m+p-1) for p stages, m microbatches and v
virtual stages per rank (v = 1: GPipe and 1F1B). Definitions in docs/cross-rank.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.comm_names import P2P_OPS
from analysis.crossrank.blame import blame

PIPELINE_COLUMNS = ["rank", "steps", "measured_bubble_pct", "theory_bubble_pct",
                    "recv_wait_pct", "transfer_pct", "idle_pct", "caused_recv_wait_ms_per_step",
                    "holds_back"]


def theory_bubble_pct(stages: int, microbatches: int, virtual_stages: int = 1) -> float:
    return 100.0 * (stages - 1) / (virtual_stages * microbatches + stages - 1)


def microbatches_of(waits: pd.DataFrame) -> int | None:
    """Per step, a stage receives one activation per microbatch from the stage before it; the
    median over the last stage's steps of those recvs (v = 1)."""
    recvs = waits[(waits["op"] == "recv") & (waits["peer"] < waits["rank"])]
    if recvs.empty:
        return None
    last = recvs[recvs["rank"] == recvs["rank"].max()]
    return int(np.median(last.groupby("step").size()))


def schedule_of(waits: pd.DataFrame, microbatches: int | None = None,
                virtual_stages: int = 1) -> dict | None:
    """The pipeline's shape as the bubbles read it: stages p (the ranks with matched p2p ops),
    microbatches m (given, else microbatches_of), virtual stages v and the theoretical bubble
    (p-1)/(v*m+p-1) in %; None without p2p ops. m and the bubble are None where unknown."""
    p2p = waits[waits["op"].isin(P2P_OPS)]
    if p2p.empty:
        return None
    stages = int(p2p["rank"].nunique())
    m = microbatches or microbatches_of(p2p)
    return {"stages": stages, "microbatches": m, "virtual_stages": int(virtual_stages),
            "theory_bubble_pct": theory_bubble_pct(stages, m, virtual_stages) if m else None}


def _transfer_time(p2p: pd.DataFrame, per: pd.DataFrame) -> pd.Series:
    """Per rank: the union of its p2p transfer intervals [end - transfer, end) in each step, at
    most the step's time. Summing would count twice the sends that gloo stamps complete only
    when the schedule waits on them, which overlap each other and the recvs."""
    step_ns = per.set_index(["rank", "step"])["step_ns"]
    per_step = {}
    for (rank, step), ops in p2p.groupby(["rank", "step"]):
        ends = ops["end_ns"].to_numpy()
        covered = intervals.total(ends - ops["transfer_ns"].to_numpy(), ends)
        per_step[(rank, step)] = min(covered, step_ns.get((rank, step), covered))
    return pd.Series(per_step, dtype="float64").groupby(level=0).sum()


def pipeline_bubbles(waits: pd.DataFrame, work: pd.DataFrame, microbatches: int | None = None,
                     virtual_stages: int = 1) -> pd.DataFrame:
    """Per stage (rank with matched p2p ops): bubble split and theory; `work` has rank, step,
    step_ns, work_ns (the breakdown's per-step frame). Empty when the run has no p2p."""
    p2p = waits[waits["op"].isin(P2P_OPS)]
    if p2p.empty or work is None or work.empty:
        return pd.DataFrame(columns=PIPELINE_COLUMNS)
    stages = sorted(p2p["rank"].unique())
    m = microbatches or microbatches_of(p2p)
    per = work[work["rank"].isin(stages)].dropna(subset=["work_ns"])
    per = per[per["step"].isin(p2p["step"].unique())]
    totals = per.groupby("rank").agg(steps=("step", "nunique"), step_ns=("step_ns", "sum"),
                                     work_ns=("work_ns", "sum"))
    if totals.empty:  # no stage has a step both with p2p ops and with work (records cut short)
        return pd.DataFrame(columns=PIPELINE_COLUMNS)
    kept = p2p[p2p.set_index(["rank", "step"]).index.isin(per.set_index(["rank", "step"]).index)]
    recv_wait = kept[kept["op"] == "recv"].groupby("rank")["wait_ns"].sum()
    transfer = _transfer_time(kept, per)
    # Charged along waiting chains (crossrank.blame): a stage late only because it waited for
    # the stage after it passes the blame on. Over every step with p2p ops (the records cover
    # them all, the profiled work a few): which stage holds the others back is told from all.
    charged = blame(waits)
    charged = charged[charged["instance"].isin(p2p["instance"])]
    caused = charged.groupby("culprit")["caused_ns"].sum() / p2p["step"].nunique()
    totals = totals.join([recv_wait.rename("recv_ns"), transfer.rename("transfer_ns"),
                          caused.rename("caused_per_step_ns")]).fillna(0)
    bubble = (totals["step_ns"] - totals["work_ns"]).clip(lower=0)
    scale = 100.0 / totals["step_ns"]
    table = pd.DataFrame({
        "rank": totals.index.astype(int), "steps": totals["steps"].astype(int),
        "measured_bubble_pct": bubble * scale,
        "theory_bubble_pct": theory_bubble_pct(len(stages), m, virtual_stages) if m else np.nan,
        "recv_wait_pct": totals["recv_ns"] * scale, "transfer_pct": totals["transfer_ns"] * scale,
        "idle_pct": (bubble - totals["recv_ns"] - totals["transfer_ns"]).clip(lower=0) * scale,
        "caused_recv_wait_ms_per_step": totals["caused_per_step_ns"] / 1e6,
    }).reset_index(drop=True)
    holder = table["caused_recv_wait_ms_per_step"].idxmax()
    table["holds_back"] = (table.index == holder) & (table["caused_recv_wait_ms_per_step"] > 0)
    return table[PIPELINE_COLUMNS]
