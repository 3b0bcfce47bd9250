"""What-if answers of a pipeline (docs/critical-path.md, "The pipeline's bubble").

- `pipeline_bubble_theoretical`: per analysed step, each stage's wait for peers in its p2p ops
  beyond the theoretical bubble θ = (p-1)/(v*m+p-1) of its step is removed, by shortening the
  host work of the stage that wait is charged to (crossrank.blame), and every step propagated;
- `pipeline_microbatches`: the step with 2m microbatches instead of m, an estimate from the
  bubble formula: the step at the theoretical bubble (the answer above, else the measured one)
  times (1 - θ(m)) / (1 - θ(2m)).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.crossrank.blame import blame
from analysis.crossrank.grouped import union_lengths
from analysis.crossrank.step_graph import ISSUE, STEP_END, StepGraph
from analysis.crossrank.what_if import IGNORED, Change

BUBBLE = "pipeline_bubble_theoretical"
MICROBATCHES = "pipeline_microbatches"
# The schedules the bubble formula (p-1)/(v*m+p-1) holds for: GPipe, 1F1B (which opens no span:
# None) and interleaved 1F1B. Looped BFS and the zero-bubble schedules (backward split into
# input and weight parts) have other bubbles.
FORMULA_KINDS = (None, "gpipe", "interleaved")


def bubble_fraction(stages: int, microbatches: int, virtual_stages: int = 1) -> float:
    """θ = (p-1)/(v*m+p-1), as a fraction of the step."""
    return (stages - 1) / (virtual_stages * microbatches + stages - 1)


def _theta(schedule: dict | None) -> float | None:
    if not schedule or not schedule.get("microbatches") or schedule.get("split_backward"):
        return None
    return bubble_fraction(schedule["stages"], schedule["microbatches"],
                           schedule.get("virtual_stages") or 1)


def excess_waits(graph: StepGraph, theta: float) -> pd.DataFrame:
    """Per stage and analysed step in which it waited in p2p ops: wait_ns (the union of its p2p
    ops' waits [arrival, arrival + wait)), step_ns (its own step) and excess_ns, the wait to
    remove for the wait to be θ of the step shortened by as much:
    max(0, (wait - θ * step) / (1 - θ))."""
    ops = graph.ops
    p2p = ops[ops["op"].isin(P2P_OPS).to_numpy() & (ops["wait_ns"] > 0).to_numpy()]
    if p2p.empty:
        return pd.DataFrame(columns=["rank", "step", "wait_ns", "step_ns", "excess_ns"])
    grouped = p2p.groupby(["rank", "step"], sort=True)
    codes = grouped.ngroup().to_numpy("int64")
    arrival = p2p["arrival_ns"].to_numpy("int64")
    wait = union_lengths(codes, grouped.ngroups, arrival,
                         arrival + p2p["wait_ns"].to_numpy("int64"))
    frame = grouped.size().reset_index()[["rank", "step"]].assign(wait_ns=wait)
    steps = graph.steps.assign(step_ns=graph.steps["end_ns"] - graph.steps["start_ns"])
    frame = frame.merge(steps[["rank", "step", "step_ns"]], on=["rank", "step"])
    excess = (frame["wait_ns"] - theta * frame["step_ns"]) / (1 - theta)
    return frame.assign(excess_ns=excess.clip(lower=0))


def stage_cuts(graph: StepGraph, excess: pd.DataFrame) -> pd.DataFrame:
    """Per culprit stage and step: cut_ns, the most of the excess waits charged to it by any
    stage that waited for it (each stage's excess split among the culprits of its p2p waits in
    the step, as crossrank.blame charges them), and limit_ns, the issue of its last op in the
    step that a peer waited for."""
    ops = graph.ops
    waited = ops[ops["op"].isin(P2P_OPS).to_numpy() & (ops["wait_ns"] > 0).to_numpy()
                 & (ops["rank"] != ops["last_rank"]).to_numpy()]
    charged = blame(ops)
    on = waited[["rank", "step", "instance"]].merge(charged, on="instance")
    on = on[on["culprit"] != on["rank"]]
    if on.empty:
        return pd.DataFrame(columns=["rank", "step", "cut_ns", "limit_ns"])
    shares = on.groupby(["rank", "step", "culprit"])["caused_ns"].sum()
    shares = shares / shares.groupby(level=["rank", "step"]).transform("sum")
    wanted = shares.reset_index(name="share").merge(excess, on=["rank", "step"])
    wanted["cut_ns"] = wanted["share"] * wanted["excess_ns"]
    cuts = wanted.groupby(["culprit", "step"])["cut_ns"].max().reset_index()
    cuts = cuts.rename(columns={"culprit": "rank"})
    made_wait = ops[(ops["rank"] == ops["last_rank"]).to_numpy()
                    & ops["instance"].isin(charged["instance"]).to_numpy()]
    limits = made_wait.groupby(["rank", "step"])["issue_ns"].max().rename("limit_ns")
    cuts = cuts.merge(limits.reset_index(), on=["rank", "step"])
    return cuts[cuts["cut_ns"] > 0].reset_index(drop=True)


def shortened(graph: StepGraph, cuts: pd.DataFrame) -> np.ndarray:
    """Durations with each culprit's host work in a step (its issues' and step end's positive
    durations), up to its last op a peer waited for, scaled by max(0, 1 - cut / their sum)."""
    work = np.flatnonzero(np.isin(graph.kind, (ISSUE, STEP_END)) & (graph.duration > 0))
    nodes = pd.DataFrame({"node": work, "rank": graph.rank[work], "step": graph.step[work],
                          "time": graph.time[work], "duration": graph.duration[work]})
    nodes = nodes.merge(cuts, on=["rank", "step"])
    nodes = nodes[nodes["time"] <= nodes["limit_ns"]]
    total = nodes.groupby(["rank", "step"])["duration"].transform("sum")
    factor = (1 - nodes["cut_ns"] / total).clip(lower=0)
    changed = graph.duration.copy()
    changed[nodes["node"].to_numpy()] = np.rint(nodes["duration"] * factor).astype(np.int64)
    return changed


def bubble_changes(graph: StepGraph, schedule: dict | None) -> list[Change]:
    """The bubble at its theoretical value, where the schedule's θ is known and some stage's
    p2p waits exceed it."""
    theta = _theta(schedule)
    if theta is None or not 0 <= theta < 1 or graph.ops.empty:
        return []
    cuts = stage_cuts(graph, excess_waits(graph, theta))
    if cuts.empty:
        return []
    changed = shortened(graph, cuts)
    if np.array_equal(changed, graph.duration):
        return []
    p, m = schedule["stages"], schedule["microbatches"]
    v = schedule.get("virtual_stages") or 1
    shape = f"{p} stages, {m} microbatches" + (f", {v} virtual stages per rank" if v > 1 else "")
    return [Change({
        "change": f"pipeline bubble at its theoretical {100 * theta:.1f}% ({shape})",
        "kind": BUBBLE, "ranks": sorted(int(r) for r in cuts["rank"].unique()),
        "assumptions": f"per step, each stage's wait for peers in p2p ops beyond "
                       f"(p-1)/(v*m+p-1) = {100 * theta:.1f}% of its step (the step shortened "
                       f"by as much) removed, by shortening in proportion the host work of the "
                       f"stage the wait is charged to, up to its last op a peer waited for; "
                       f"every other work and transfer unchanged; " + IGNORED}, changed)]


def microbatch_answers(graph: StepGraph, schedule: dict | None, rows: list[dict],
                       measured_ms: float) -> list[dict]:
    """The step with twice the microbatches, estimated from the bubble formula: the step at the
    theoretical bubble (the answer of BUBBLE in `rows`, else the measured mean) times
    (1 - θ(m)) / (1 - θ(2m)); for GPipe, 1F1B and interleaved 1F1B only."""
    theta = _theta(schedule)
    if theta is None or schedule.get("kind") not in FORMULA_KINDS or schedule["stages"] < 2:
        return []
    p, m = schedule["stages"], schedule["microbatches"]
    v = schedule.get("virtual_stages") or 1
    doubled = bubble_fraction(p, 2 * m, v)
    at_theory = next((r["predicted_step_ms"] for r in rows if r["kind"] == BUBBLE), measured_ms)
    predicted = at_theory * (1 - theta) / (1 - doubled)
    base = ("the step at the theoretical bubble (the answer above)"
            if any(r["kind"] == BUBBLE for r in rows) else "the measured step")
    stages = sorted(int(r) for r in graph.ops.loc[graph.ops["op"].isin(P2P_OPS), "rank"].unique())
    return [{
        "change": f"pipeline with {2 * m} microbatches instead of {m} (bubble "
                  f"{100 * doubled:.1f}% instead of {100 * theta:.1f}%)",
        "kind": MICROBATCHES, "ranks": stages,
        "saved_ms_per_step": round(measured_ms - predicted, 3),
        "predicted_step_ms": round(predicted, 3),
        "assumptions": f"an estimate, not propagated: {base} x (1 - {100 * theta:.1f}%) / "
                       f"(1 - {100 * doubled:.1f}%), the bubble (p-1)/(v*m+p-1) of GPipe and "
                       f"1F1B; each microbatch half as large and its work half as long (no "
                       f"fixed cost per microbatch), p2p transfers and the activation memory "
                       f"of twice the microbatches not modelled; " + IGNORED}]
