"""Bottleneck findings: what costs step time, the evidence in numbers, and what to do about it.

Each finding is its own function with its definition and threshold in docs/report.md; a finding
appears only when its threshold is met. `share_pct` is the share of step time at stake, summed
over all analysed (rank, step) rows; `ms_per_step` is that share of the analysed rows' mean step
time. Findings are not additive (a rank waiting for a straggler also shows exposed
communication). "Ranks train alone" (a world size above 1 without any collective) costs no step
time but defeats the run: its share is NaN and it sorts first. Memory near capacity is a risk,
not a time cost: its share_pct is NaN and it sorts last. Notes (what could not be told) are
analysis.findings.notes', never ranked here.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.contracts import FINDING_COLUMNS, CrossRank, Finding
from analysis.crossrank import findings as cross_findings
from analysis.findings.advice import (
    bubble_suggestion,
    exposed_suggestion,
    idle_cause,
    imbalance_suggestion,
    small_message_hint,
    straggler_data_text,
)
from analysis.findings.inputs import (
    RankedGroups,
    analysed_steps,
    ddp_buckets,
    floats,
    input_shapes_vary,
    series_sum,
)
from analysis.findings.labels import (
    collective_text,
    issuer_of,
    ms,
    rank_list,
    run_kind,
)
from analysis.findings.late_causes import MORE_WORK_RATIO
from analysis.findings.late_ranks import ON_AVERAGE, stage_text, stage_work, straggler_text
from analysis.findings.notes import ALONE, ranks_alone
from analysis.findings.resource_findings import (
    TOP_COLLECTIVES,
    _low_bus_bandwidth,
    _memory_near_capacity,
)
from analysis.rank import issuers, pipeline_schedule
from analysis.rank.idle_activity import idle_by_activity

_ms = ms

# ---- thresholds (docs/report.md explains each) ---------------------------------------------------
MIN_SHARE_PCT = 5.0  # exposed comm, each idle cause, imbalance, pipeline bubble
STRAGGLER_MIN_STEP_FRACTION = 0.5  # slowest in at least half the steps ...
STRAGGLER_MIN_STEPS = 2  # ... and in at least two of them


def _empty() -> pd.DataFrame:
    return pd.DataFrame({
        "finding": pd.Series(dtype="object"), "share_pct": pd.Series(dtype="float64"),
        "evidence": pd.Series(dtype="object"), "suggestion": pd.Series(dtype="object"),
        "ranks": pd.Series(dtype="object"), "ms_per_step": pd.Series(dtype="float64"),
    })


def find_bottlenecks(per_step, per_rank, collectives, idle_gaps, traces,
                     cross_rank: CrossRank | None = None, late: dict | None = None
                     ) -> pd.DataFrame:
    """Findings that apply, "ranks train alone" first, then largest share of step time first;
    an empty frame when none does, and always for a run without analysed steps.

    `cross_rank` is the result of `analysis.crossrank.cross_rank`; where it matched ops, the
    exposed-communication finding counts exposed transfer only, "ranks wait for rank R"
    replaces the work-based straggler and the pipeline bubble is judged per stage against theory.
    Where no rank issued a collective, nobody waits: no imbalance or straggler is named from the
    spread of step times.
    `late` holds the late ranks and their causes
    (analysis.findings.late_ranks.late_ranks): the advice of "ranks wait for rank R" and of the
    pipeline stage that holds the others back fits the causes that hold.
    """
    per_step = _frame(per_step)
    per_rank = _frame(per_rank)
    collectives = _frame(collectives)
    idle_gaps = _frame(idle_gaps)
    steps = analysed_steps(per_step)
    if steps.empty:
        return _empty()
    pipeline = is_pipeline_run(collectives, traces)
    kind = run_kind(per_rank, traces)
    device = device_kind(per_step, per_rank, kind)
    crossed = cross_findings.matched(cross_rank)
    if crossed:
        steps = steps.assign(wait_for_peers_ns=cross_findings.peer_wait_ns(steps, cross_rank),
                             exposed_comm_ns=cross_findings.exposed_transfer_ns(steps, cross_rank))
    # What needs the kernel-level split is measured on the profiled ones of the analysed steps;
    # waiting for peers comes from every analysed step's records (docs/report.md).
    split_known = ~np.isnan(floats(steps, "compute_only_ns"))
    profiled = steps if split_known.all() else steps[split_known].reset_index(drop=True)
    late = late or {}
    # A stage's work against the others' (priced at the common speed): layers move off a stage
    # only where it has more (docs/report.md, "Why a rank is late").
    work_of = stage_work(traces, steps["step"].unique()) if pipeline else None
    pipeline_stages = (cross_findings.pipeline_stages(
        cross_rank, stage=lambda rank: stage_text(late.get(rank))) if crossed else [])
    alone = ranks_alone(steps, collectives, traces, cross_rank)
    sampled = _measured_in(profiled, steps)
    findings = [
        *alone,
        *sampled(_exposed_communication(profiled, collectives, pipeline,
                                        issuers.run_ddp_accumulation(traces),
                                        transfer_only=crossed)),
        *sampled(_device_idle(profiled, idle_gaps, device)),
        *(waited := cross_findings.ranks_wait_for(
            steps, cross_rank, why=lambda rank: straggler_text(late.get(rank)))
          if crossed else []),
        *([] if alone or crossed else sampled(_imbalance(
            profiled, pipeline, kind, variable_inputs=input_shapes_vary(traces),
            work_of=work_of))),
        *(_measured_waiting(steps, pipeline, input_shapes_vary(traces), late)
          if crossed and not waited else []),
        *(pipeline_stages or sampled(_pipeline_bubble(profiled, pipeline,
                                                      pipeline_schedule.detect(traces),
                                                      work_of))),
        *sampled(_low_bus_bandwidth(profiled, kind, collectives)),
        *_memory_near_capacity(per_rank),
    ]
    if not findings:
        return _empty()
    table = pd.DataFrame([f.finding_row() for f in findings], columns=FINDING_COLUMNS)
    table["share_pct"] = table["share_pct"].astype("float64")
    table["ms_per_step"] = table["share_pct"] / 100 * floats(steps, "step_ns").mean() / 1e6
    first = (table["finding"] == ALONE).to_numpy()
    table = pd.concat([table[first], table[~first].sort_values(
        "share_pct", ascending=False, na_position="last", kind="stable")])
    return table.reset_index(drop=True)


def _measured_in(profiled: pd.DataFrame, analysed: pd.DataFrame):
    """A function that marks findings measured on the profiled steps: where those are fewer
    than the analysed steps, each one's evidence says on how many it was measured."""
    def counted(frame: pd.DataFrame) -> int:
        return len(frame[["rank", "step"]].drop_duplicates()) if len(frame) else 0

    few, every = counted(profiled), counted(analysed)

    def mark(findings: list[Finding]) -> list[Finding]:
        if few == every:
            return findings
        said = (f" (Measured in the {few} profiled of the {every} analysed rank-steps; the "
                f"share is applied to the analysed steps' mean step.)")
        return [dataclasses.replace(f, evidence=f.evidence + said) for f in findings]
    return mark


def device_kind(per_step: pd.DataFrame, per_rank: pd.DataFrame, kind: str) -> str:
    """"gpu" where any analysed rank's trace has device activity (the breakdown's kind), else
    "cpu": what an idle gap leaves idle, the device or the training threads."""
    for frame in (per_step, per_rank):
        if "kind" in frame.columns and len(frame):
            return "gpu" if (frame["kind"] == "gpu").any() else "cpu"
    return kind


def _frame(value) -> pd.DataFrame:
    return value if isinstance(value, pd.DataFrame) else pd.DataFrame()


# ---- pipeline detection -------------------------------------------------------------------------
def is_pipeline_run(collectives: pd.DataFrame, traces) -> bool:
    """A pipeline run: send/recv ops in the collectives table, or a script named like one."""
    if not collectives.empty and "op" in collectives.columns:
        counts = collectives.loc[collectives["op"].isin(P2P_OPS), "count"] \
            if "count" in collectives.columns else collectives["op"].isin(P2P_OPS)
        if pd.to_numeric(counts, errors="coerce").fillna(0).sum() > 0:
            return True
    for trace in traces or []:
        records = getattr(trace, "records", None)
        for record in getattr(records, "manifest", None) or []:
            script = getattr(record, "script", None)
            if isinstance(script, str) and "pipe" in os.path.basename(script).lower():
                return True
    return False


# ---- exposed communication ----------------------------------------------------------------------
def _exposed_communication(steps: pd.DataFrame, collectives: pd.DataFrame, pipeline: bool,
                           accumulation: str | None = None, transfer_only: bool = False) -> list:
    """Share: summed exposed_comm_ns over summed step_ns. In pipeline runs the send/recv part of
    communication time is left to the pipeline-bubble finding, so the exposed time is scaled by
    the non-p2p share of collective time. The suggestion fits the top group's op and issuer.
    With `transfer_only`, exposed_comm_ns already holds exposed transfer (waiting for peers is
    the "ranks wait for rank R" finding's, and no bucket size shortens it).
    """
    if steps.empty or np.isnan(exposed_ns := floats(steps, "exposed_comm_ns")).all():
        return []
    step_ns = floats(steps, "step_ns")
    total_step = series_sum(step_ns)
    exposed = series_sum(exposed_ns)
    ranked = RankedGroups(collectives, P2P_OPS if pipeline else ())
    scale = 1.0
    if pipeline:
        all_ops = RankedGroups(collectives)
        if not all_ops.empty:
            scale = (ranked.total_us.sum() / all_ops.total_us.sum() if not ranked.empty
                     else 0.0)
    share = exposed * scale / total_step * 100
    if share < MIN_SHARE_PCT:
        return []
    per_step_ns = exposed * scale / len(steps)
    what = "Transfer (waiting for peers left out)" if transfer_only else "Communication"
    evidence = (f"{what} not overlapped with compute takes {_ms(per_step_ns)} of a "
                f"{_ms(series_sum(step_ns) / np.count_nonzero(~np.isnan(step_ns)))} step on "
                f"average ({share:.1f}% of step time{', send/recv excluded' if pipeline else ''}).")
    suggestion = "Overlap communication with compute."
    if not ranked.empty:
        top = ranked.rows(TOP_COLLECTIVES)
        named = "; ".join(collective_text(row) for row in top)
        evidence += f" Top collectives by time: {named}."
        issuer = issuer_of(top[0])
        buckets = ddp_buckets(collectives) if issuer == "ddp" else None
        suggestion = exposed_suggestion(top[0]["op"], issuer, accumulation, buckets)
        bucket = floats(collectives, "bucket_min_bytes")[ranked.positions]
        if ranked.time_share[bucket < (1 << 20)].sum() > 0.5:
            suggestion += small_message_hint(issuer, buckets)
    ranks = rank_list(steps["rank"].to_numpy()[exposed_ns > 0])
    name = "exposed transfer" if transfer_only else "exposed communication"
    return [Finding(name, share, evidence, suggestion, ranks)]


# ---- device idle by host activity ---------------------------------------------------------------
def _device_idle(steps: pd.DataFrame, idle_gaps: pd.DataFrame, kind: str = "gpu") -> list:
    """One finding per host activity: summed gap time over summed step_ns, gaps of analysed
    (rank, step) rows only (analysis.rank.idle_activity). `kind` is the traces' (device_kind):
    on CPU traces the training threads sit idle, and the advice speaks of the host alone.
    """
    needed = ("rank", "step", "dur_ns", "host_activity")
    if steps.empty or idle_gaps.empty or any(c not in idle_gaps.columns for c in needed):
        return []
    activities, by_rank = idle_by_activity(steps, idle_gaps)
    total_step = steps["step_ns"].sum()
    rank_step = steps.groupby("rank")["step_ns"].sum()
    # On CPU traces the "device" is the training threads: there is no accelerator to sit idle.
    subject, name = (("The training threads", "idle") if kind == "cpu"
                     else ("The device", "device idle"))
    findings = []
    for row in activities.itertuples(index=False):
        label, doing, suggestion = idle_cause(row.host_activity, kind)
        share = row.dur_ns / total_step * 100
        if share < MIN_SHARE_PCT:
            continue
        ranks = by_rank.loc[by_rank["host_activity"] == row.host_activity]
        per_rank = (ranks["dur_ns"].to_numpy()
                    / rank_step.reindex(ranks["rank"].to_numpy()).to_numpy() * 100)
        heavy = ranks["rank"].to_numpy()[per_rank >= MIN_SHARE_PCT]
        evidence = (f"{subject} sat idle {_ms(row.dur_ns / len(steps))} per step on "
                    f"average ({share:.1f}% of step time) in {row.gaps} gaps while the host "
                    f"was {doing}; the longest gap was {_ms(row.longest_ns)} on rank "
                    f"{int(row.longest_rank)}, step {int(row.longest_step)}.")
        findings.append(Finding(f"{name}: {label}", share, evidence, suggestion,
                                 rank_list(heavy if len(heavy) else ranks["rank"])))
    return findings


# ---- imbalance and stragglers -------------------------------------------------------------------
def _more_work(work_of, rank: int) -> bool:
    """Whether a pipeline stage has more work than the others (late_ranks.stage_work): True
    where its ops say so or where no op tells (the work-based measure stands alone)."""
    ratio = work_of(rank) if work_of is not None else None
    return ratio is None or ratio >= MORE_WORK_RATIO


def _imbalance(steps: pd.DataFrame, pipeline: bool, kind: str = "gpu",
               name_straggler: bool = True, variable_inputs: bool | None = None,
               work_of=None) -> list:
    """Per step with at least two ranks: wait = max(work_ns) - mean(work_ns) over ranks.
    Share: summed wait over summed mean step_ns. A straggler is a rank with the most work in at
    least half of those steps (and at least two); it is not named when the cross-rank pass
    could match ops (its "ranks wait for rank R" finding names the rank from measured waits).
    Longer sequences and length bucketing are named only where `variable_inputs` is True (the
    traced input shapes vary between steps: inputs.input_shapes_vary).
    """
    if steps.empty or steps["work_ns"].notna().sum() == 0:
        return []
    if len(np.unique(steps["rank"].to_numpy())) < 2:
        return []  # no step has two ranks (rank is float64 and never NaN in _analysed_steps)
    timed = steps.dropna(subset=["work_ns"])
    per_step = []
    for step, group in timed.groupby("step", sort=True):
        if group["rank"].nunique() < 2:
            continue
        heaviest = group.loc[group["work_ns"].idxmax()]
        per_step.append({
            "step": step, "wait_ns": group["work_ns"].max() - group["work_ns"].mean(),
            "mean_step_ns": group["step_ns"].mean(), "heaviest_rank": int(heaviest["rank"]),
            "max_work_ns": group["work_ns"].max(), "mean_work_ns": group["work_ns"].mean(),
            "max_step_ns": group["step_ns"].max(), "min_step_ns": group["step_ns"].min(),
        })
    if not per_step:
        return []
    table = pd.DataFrame(per_step)
    share = table["wait_ns"].sum() / table["mean_step_ns"].sum() * 100
    if share < MIN_SHARE_PCT:
        return []
    counts = table["heaviest_rank"].value_counts()
    top_rank, top_count = int(counts.index[0]), int(counts.iloc[0])
    steps_n = len(table)
    rank_work = timed.groupby("rank")["work_ns"].mean()
    above = (rank_work[top_rank] - rank_work.mean()) / rank_work.mean() * 100
    # A rank that is busiest most often but not on average (one long step elsewhere) is noise,
    # not a straggler.
    straggler = (name_straggler and top_count >= STRAGGLER_MIN_STEPS
                 and top_count >= STRAGGLER_MIN_STEP_FRACTION * steps_n
                 and (len(counts) == 1 or counts.iloc[1] < top_count)
                 and above > 0)
    evidence = (f"Per step the busiest rank works {_ms(table['max_work_ns'].mean())} against a "
                f"mean of {_ms(table['mean_work_ns'].mean())}, so the average rank waits "
                f"{_ms(table['wait_ns'].mean())} per step ({share:.1f}% of step time) over "
                f"{steps_n} steps; step time ranged {_ms(table['min_step_ns'].min())} to "
                f"{_ms(table['max_step_ns'].max())} across ranks.")
    if straggler:
        evidence += (f" Rank {top_rank} had the most work in {top_count} of {steps_n} steps, "
                     f"{above:.1f}% above the mean.")
        hardware = ("its host and GPU with the others (clocks and temperature in nvidia-smi, "
                    "other processes, a slower NIC or PCIe link)" if kind == "gpu" else
                    "its host with the others (CPU frequency, other processes on its cores, "
                    "OMP_NUM_THREADS and core pinning, work only it does such as logging)")
        suggestion = (f"Rank {top_rank} is a straggler: compare {hardware}"
                      f"{straggler_data_text(variable_inputs)}.")
        if pipeline and _more_work(work_of, top_rank):
            suggestion += (f" In a pipeline, move layers off rank {top_rank}'s stage to "
                           f"balance the stages.")
        return [Finding(f"straggler: rank {top_rank}", share, evidence, suggestion,
                         str(top_rank))]
    suggestion = imbalance_suggestion(variable_inputs)
    if pipeline:
        suggestion += " In a pipeline, rebalance layers so each stage does equal work."
    return [Finding("load imbalance across ranks", share, evidence, suggestion,
                     rank_list(timed["rank"]))]


def _measured_waiting(steps: pd.DataFrame, pipeline: bool, variable_inputs: bool | None,
                      late: dict | None = None) -> list:
    """With matched ops and no rank named late: the measured waiting for peers
    (steps.wait_for_peers_ns, the cross-rank waits of the analysed rows) over summed step_ns.
    It replaces the work-based estimate of _imbalance, so that the finding and the waits table
    tell the same numbers. Not made in pipeline runs, whose waits are the bubble's. Where the
    others wait for one rank most by far and a cause holds for it (`late`,
    analysis.findings.late_ranks), its causes and their advice replace the list of what may
    differ."""
    if pipeline or "wait_for_peers_ns" not in steps.columns:
        return []
    wait = floats(steps, "wait_for_peers_ns")
    share = series_sum(wait) / series_sum(floats(steps, "step_ns")) * 100
    if share < MIN_SHARE_PCT:
        return []
    per_rank = (pd.DataFrame({"rank": steps["rank"].astype("int64"), "wait": wait})
                .groupby("rank")["wait"].mean().sort_values(ascending=False, kind="stable"))
    listed = ", ".join(f"rank {r} {_ms(w)}" for r, w in per_rank.items())
    evidence = (f"Ranks wait for their peers in collectives {_ms(series_sum(wait) / len(steps))} "
                f"per step on average ({share:.1f}% of step time; per rank: {listed}), and no "
                f"rank is late often enough to be named.")
    waiting = per_rank[per_rank > 0].index
    suggestion = imbalance_suggestion(variable_inputs)
    for item in (late or {}).values():
        tested = straggler_text(item)
        if item.how == ON_AVERAGE and tested is not None:
            evidence += (f" The others wait for rank {item.rank} most, {item.late_ms:.2f} ms per "
                         f"step each. {tested[0]}")
            suggestion = tested[1]
    return [Finding("waiting for peers", share, evidence, suggestion,
                     rank_list(waiting if len(waiting) else per_rank.index))]


# ---- pipeline bubble ----------------------------------------------------------------------------
def _pipeline_bubble(steps: pd.DataFrame, pipeline: bool, schedule, work_of=None) -> list:
    """For pipeline runs: a rank's bubble = 1 - summed work_ns / summed step_ns, i.e. its idle
    time plus communication not hidden under compute (a stage waiting for activations sits in
    an NCCL recv kernel or idles on gloo). Share: the mean bubble over ranks. The number of
    stages and the schedule come from the trace's pipelining spans
    (analysis.rank.pipeline_schedule). Layers are moved from the stage with the least bubble
    only where it has more work than the others (`work_of`, late_ranks.stage_work; where its
    ops cannot tell, the bubble alone decides).
    """
    if not pipeline or steps.empty or steps["work_ns"].notna().sum() == 0:
        return []
    timed = steps.dropna(subset=["work_ns"])
    per_rank = timed.groupby("rank").agg(work=("work_ns", "sum"), step=("step_ns", "sum"))
    per_rank = per_rank[per_rank["step"] > 0]
    if per_rank.empty:
        return []
    bubble = (1 - per_rank["work"] / per_rank["step"]).clip(lower=0) * 100
    share = float(bubble.mean())
    if share < MIN_SHARE_PCT:
        return []
    ranks = len(bubble)
    stages = schedule.total_stages(ranks)
    per_rank_stages = schedule.stages_per_rank or 1
    listed = ", ".join(f"rank {int(r)} {b:.1f}%" for r, b in bubble.items())
    held = (f" on {ranks} ranks ({per_rank_stages} per rank, "
            f"{schedule.kind or 'multi-stage'} schedule)" if per_rank_stages > 1 else "")
    micro = f", {schedule.microbatches} microbatches" if schedule.microbatches else ""
    evidence = (f"{stages} pipeline stages{held}{micro} spend {share:.1f}% of each step not "
                f"computing on average ({listed}).")
    suggestion = bubble_suggestion(schedule, ranks, stages)
    if (ranks > 1 and bubble.max() - bubble.min() >= MIN_SHARE_PCT
            and _more_work(work_of, int(bubble.idxmin()))):
        suggestion += (f" Stages are uneven (bubble {bubble.min():.1f}% to {bubble.max():.1f}%): "
                       f"move layers from rank {int(bubble.idxmin())} towards rank "
                       f"{int(bubble.idxmax())}.")
    return [Finding("pipeline bubble", share, evidence, suggestion, rank_list(bubble.index))]


