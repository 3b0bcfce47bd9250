"""Bottleneck findings: what costs step time, the evidence in numbers, and what to do about it.

Each finding is its own function with its definition and threshold in docs/report.md; a finding
appears only when its threshold is met. `share_pct` is the share of step time at stake, summed
over all analysed (rank, step) rows; findings are not additive (a rank waiting for a straggler
also shows exposed communication). Memory near capacity is a risk, not a time cost: its
share_pct is NaN and it sorts last.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.steps import format_ranges
from analysis.crossrank import findings as cross_findings
from analysis.findings.advice import (
    IDLE_CAUSES,
    bubble_suggestion,
    exposed_suggestion,
    small_message_hint,
)
from analysis.findings.inputs import RankedGroups, analysed_steps, floats, series_sum
from analysis.rank import issuers, pipeline_schedule
from analysis.rank import summary as rank_summary
from analysis.rank.comm.ops import UNKNOWN_BUCKET, UNKNOWN_PG
from analysis.rank.idle_activity import idle_by_activity

FINDING_COLUMNS = ["finding", "share_pct", "evidence", "suggestion", "ranks"]
_finding = cross_findings.finding_row

# ---- thresholds (docs/report.md explains each) ---------------------------------------------------
MIN_SHARE_PCT = 5.0  # exposed comm, each idle cause, imbalance, pipeline bubble
MIN_BANDWIDTH_SHARE_PCT = 1.0  # low bus bandwidth: the step time it would save
STRAGGLER_MIN_STEP_FRACTION = 0.5  # slowest in at least half the steps ...
STRAGGLER_MIN_STEPS = 2  # ... and in at least two of them
LARGE_MESSAGE_BYTES = 4 << 20  # buckets from 4 MiB up are judged on bandwidth
BUSBW_FLOOR_GBPS = {"gpu": 5.0, "cpu": 0.1}  # NCCL on GPUs; gloo on CPUs (under gigabit Ethernet)
PEER_BUSBW_FRACTION = 0.5  # below half the best same-size group of the same op and group size
MEMORY_NEAR_CAPACITY_PCT = 90.0
FRAGMENTATION_PCT = 10.0  # reserved - allocated above this share of the device: fragmentation
TOP_COLLECTIVES = 3

def _empty() -> pd.DataFrame:
    return pd.DataFrame({
        "finding": pd.Series(dtype="object"), "share_pct": pd.Series(dtype="float64"),
        "evidence": pd.Series(dtype="object"), "suggestion": pd.Series(dtype="object"),
        "ranks": pd.Series(dtype="object"),
    })


def find_bottlenecks(per_step, per_rank, collectives, idle_gaps, traces,
                     cross_rank: dict | None = None) -> pd.DataFrame:
    """Findings that apply, largest share of step time first; an empty frame when none does,
    and always for a run without analysed steps.

    `cross_rank` is the result of `analysis.crossrank.cross_rank`; where it matched ops, the
    exposed-communication finding counts exposed transfer only, "ranks wait for rank R"
    replaces the work-based straggler and the pipeline bubble is judged per stage against theory.
    """
    per_step = _frame(per_step)
    per_rank = _frame(per_rank)
    collectives = _frame(collectives)
    idle_gaps = _frame(idle_gaps)
    steps = analysed_steps(per_step)
    if steps.empty:
        return _empty()
    pipeline = is_pipeline_run(collectives, traces)
    kind = _run_kind(per_rank, traces)
    crossed = cross_findings.matched(cross_rank)
    if crossed:
        steps = steps.assign(wait_for_peers_ns=cross_findings.peer_wait_ns(steps, cross_rank),
                             exposed_comm_ns=cross_findings.exposed_transfer_ns(steps, cross_rank))
    pipeline_stages = cross_findings.pipeline_stages(cross_rank) if crossed else []
    findings = [
        *_exposed_communication(steps, collectives, pipeline, rank_summary.ddp_accumulation(traces),
                                transfer_only=crossed),
        *_device_idle(steps, idle_gaps, kind),
        *(cross_findings.ranks_wait_for(steps, cross_rank) if crossed else []),
        *(cross_findings.too_few_steps(cross_rank) if crossed else []),
        *_imbalance(steps, pipeline, kind, name_straggler=not crossed),
        *(pipeline_stages or _pipeline_bubble(steps, pipeline, pipeline_schedule.detect(traces))),
        *_low_bus_bandwidth(steps, kind, collectives),
        *_memory_near_capacity(per_rank),
    ]
    if not findings:
        return _empty()
    table = pd.DataFrame(findings, columns=FINDING_COLUMNS)
    table["share_pct"] = table["share_pct"].astype("float64")
    table = table.sort_values("share_pct", ascending=False, na_position="last", kind="stable")
    return table.reset_index(drop=True)


def _frame(value) -> pd.DataFrame:
    return value if isinstance(value, pd.DataFrame) else pd.DataFrame()


def rank_list(ranks) -> str:
    """Ranks as ranges: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    return format_ranges(sorted({int(r) for r in ranks if r is not None and not pd.isna(r)}))


def _ms(ns) -> str:
    return f"{ns / 1e6:.2f} ms"


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
        named = "; ".join(_collective_text(row) for row in top)
        evidence += f" Top collectives by time: {named}."
        issuer = _issuer(top[0])
        suggestion = exposed_suggestion(top[0]["op"], issuer, accumulation)
        bucket = floats(collectives, "bucket_min_bytes")[ranked.positions]
        if ranked.time_share[bucket < (1 << 20)].sum() > 0.5:
            suggestion += small_message_hint(issuer)
    ranks = rank_list(steps["rank"].to_numpy()[exposed_ns > 0])
    name = "exposed transfer" if transfer_only else "exposed communication"
    return [_finding(name, share, evidence, suggestion, ranks)]


def _collective_text(row: dict) -> str:
    busbw = row.get("busbw_gbps", float("nan"))
    bandwidth = f", busbw {busbw:.2f} GB/s" if _finite(busbw) else ""
    return (f"{_group_label(row)} x{int(row.get('count', 0))} {row['total_us'] / 1e3:.2f} ms "
            f"({row['time_share'] * 100:.0f}% of comm time{bandwidth})")


_ISSUER_TEXT = {"ddp": "DDP", "fsdp1": "FSDP", "fsdp2": "FSDP2", "functional": "functional",
                "p2p": "p2p", "c10d": "torch.distributed"}


def _issuer(row) -> str:
    issuer = row.get("issuer") if hasattr(row, "get") else None
    return issuer if isinstance(issuer, str) else issuers.UNKNOWN


def _group_label(row: dict) -> str:
    """"DDP all_reduce on mesh_dp (1) 16-32 MiB"; "pg ?" and "size ?" where the trace did not
    say; the issuer is left out where it is unknown."""
    pg = row.get("pg")
    bucket = row.get("size_bucket")
    pg_id = row.get("pg_id")
    if pg is None or pg == UNKNOWN_PG or pd.isna(pg):
        pg_text = "pg ?"
    elif isinstance(pg_id, str) and pg != pg_id and pg.endswith(f"({pg_id})"):
        pg_text = f"on {pg[:-len(pg_id) - 2]}(pg {pg_id})"  # "on mesh_dp (pg 1)"
    else:
        pg_text = f"pg {pg}"
    unknown = bucket is None or bucket == UNKNOWN_BUCKET or pd.isna(bucket)
    size_text = "size ?" if unknown else bucket
    issuer = _ISSUER_TEXT.get(_issuer(row))
    return f"{issuer + ' ' if issuer else ''}{row['op']} {pg_text} {size_text}"


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# ---- device idle by host activity ---------------------------------------------------------------
def _device_idle(steps: pd.DataFrame, idle_gaps: pd.DataFrame, kind: str = "gpu") -> list:
    """One finding per host activity: summed gap time over summed step_ns, gaps of analysed
    (rank, step) rows only (analysis.rank.idle_activity).
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
        label, doing, suggestion = IDLE_CAUSES.get(row.host_activity, IDLE_CAUSES["other"])
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
        findings.append(_finding(f"{name}: {label}", share, evidence, suggestion,
                                 rank_list(heavy if len(heavy) else ranks["rank"])))
    return findings


# ---- imbalance and stragglers -------------------------------------------------------------------
def _imbalance(steps: pd.DataFrame, pipeline: bool, kind: str = "gpu",
               name_straggler: bool = True) -> list:
    """Per step with at least two ranks: wait = max(work_ns) - mean(work_ns) over ranks.
    Share: summed wait over summed mean step_ns. A straggler is a rank with the most work in at
    least half of those steps (and at least two); it is not named when the cross-rank pass
    could match ops (its "ranks wait for rank R" finding names the rank from measured waits).
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
        suggestion = (f"Rank {top_rank} is a straggler: compare {hardware}, and check whether "
                      f"its data shard carries more work (longer sequences, larger images).")
        if pipeline:
            suggestion += (f" In a pipeline, move layers off rank {top_rank}'s stage to "
                           f"balance the stages.")
        return [_finding(f"straggler: rank {top_rank}", share, evidence, suggestion,
                         str(top_rank))]
    suggestion = ("Work differs across ranks from step to step: balance it per step (bucket "
                  "samples by length, equal tokens per rank, drop_last=True) so no rank waits "
                  "in the next collective.")
    if pipeline:
        suggestion += " In a pipeline, rebalance layers so each stage does equal work."
    return [_finding("load imbalance across ranks", share, evidence, suggestion,
                     rank_list(timed["rank"]))]


# ---- pipeline bubble ----------------------------------------------------------------------------
def _pipeline_bubble(steps: pd.DataFrame, pipeline: bool, schedule) -> list:
    """For pipeline runs: a rank's bubble = 1 - summed work_ns / summed step_ns, i.e. its idle
    time plus communication not hidden under compute (a stage waiting for activations sits in
    an NCCL recv kernel or idles on gloo). Share: the mean bubble over ranks. The number of
    stages and the schedule come from the trace's pipelining spans
    (analysis.rank.pipeline_schedule).
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
    if ranks > 1 and bubble.max() - bubble.min() >= MIN_SHARE_PCT:
        suggestion += (f" Stages are uneven (bubble {bubble.min():.1f}% to {bubble.max():.1f}%): "
                       f"move layers from rank {int(bubble.idxmin())} towards rank "
                       f"{int(bubble.idxmax())}.")
    return [_finding("pipeline bubble", share, evidence, suggestion, rank_list(bubble.index))]


# ---- low achieved bus bandwidth -----------------------------------------------------------------
def _low_bus_bandwidth(steps: pd.DataFrame, kind: str, collectives: pd.DataFrame) -> list:
    """Groups of large messages (bucket >= LARGE_MESSAGE_BYTES, not barrier) whose busbw is below
    their expectation: max(the backend floor, PEER_BUSBW_FRACTION x the best busbw of another
    group with the same op, group size and bucket). A group would save
    total_us * (1 - busbw / target) at its target busbw (the peer's best when the peer rule
    flagged it, else the floor). Share: the saved share of all collective time times the share
    of step time the device spent communicating ((comm_only + overlap) / step), so that ops and
    steps covering different windows (records vs profiled steps) still compare.
    """
    needed = ("op", "pg_size", "bucket_min_bytes", "busbw_gbps", "total_us")
    if collectives.empty or steps.empty or any(c not in collectives.columns for c in needed):
        return []
    if _no_large_message_groups(collectives):
        return []
    floor = BUSBW_FLOOR_GBPS[kind]
    table = collectives.copy()
    for column in ("bucket_min_bytes", "busbw_gbps", "total_us"):
        table[column] = pd.to_numeric(table[column], errors="coerce")
    all_comm_us = table.loc[table["total_us"] > 0, "total_us"].sum()
    comm_ns = steps[["comm_only_ns", "overlap_ns"]].sum(axis=1, min_count=1).fillna(0).sum()
    comm_step_share = comm_ns / steps["step_ns"].sum()
    table = table[(table["bucket_min_bytes"] >= LARGE_MESSAGE_BYTES) & (table["op"] != "barrier")
                  & (table["busbw_gbps"] > 0) & (table["total_us"] > 0)]
    if table.empty or all_comm_us <= 0 or comm_step_share <= 0:
        return []
    table["pg_size_key"] = pd.to_numeric(table["pg_size"], errors="coerce").fillna(-1)
    table["peer_best"] = table.groupby(["op", "pg_size_key", "bucket_min_bytes"])["busbw_gbps"] \
        .transform("max")
    table["by_peer"] = table["busbw_gbps"] < PEER_BUSBW_FRACTION * table["peer_best"]
    table["target"] = np.where(table["by_peer"], np.maximum(floor, table["peer_best"]), floor)
    low = table[table["by_peer"] | (table["busbw_gbps"] < floor)].copy()
    if low.empty:
        return []
    saved_us = low["total_us"] * (1 - low["busbw_gbps"] / low["target"])
    low["share"] = saved_us / all_comm_us * comm_step_share * 100
    share = float(low["share"].sum())
    if share < MIN_BANDWIDTH_SHARE_PCT:
        return []
    low = low.sort_values("share", ascending=False)
    parts = []
    for row in low.head(TOP_COLLECTIVES).to_dict("records"):
        reason = (f"under half of {row['peer_best']:.2f} GB/s on another group of the same size"
                  if row["by_peer"]
                  else f"under the {floor:g} GB/s floor for {_backend(kind)}")
        parts.append(f"{_group_label(row)}: busbw {row['busbw_gbps']:.2f} GB/s, {reason}")
    evidence = ("Large messages reach low bus bandwidth: " + "; ".join(parts)
                + f". Reaching the expected bandwidth would save {share:.1f}% of step time "
                  "(less where the collective is hidden under compute).")
    suggestion = ("Check the transport: run with NCCL_DEBUG=INFO and look for NET/Socket where "
                  "NVLink, P2P or InfiniBand is expected, check `nvidia-smi topo -m` and "
                  "NCCL_P2P_DISABLE/NCCL_IB_DISABLE, and compare with nccl-tests "
                  "(all_reduce_perf) on the same nodes. Collective time includes waiting for late "
                  "ranks, so fix a straggler or imbalance finding first."
                  if kind == "gpu" else
                  "Check the network gloo uses (GLOO_SOCKET_IFNAME on the fastest interface, "
                  "not loopback across hosts or a management NIC), and that other processes do "
                  "not saturate the CPUs gloo needs. Collective time includes waiting for late "
                  "ranks, so fix a straggler or imbalance finding first.")
    ranks = rank_list(steps["rank"])
    return [_finding("low bus bandwidth", share, evidence, suggestion, ranks)]


def _no_large_message_groups(collectives: pd.DataFrame) -> bool:
    """True where the numeric columns are float64 and no group passes the filter of large
    messages, barrier left out (the finding is then empty): its frame work is left out."""
    columns = ("bucket_min_bytes", "busbw_gbps", "total_us")
    if any(collectives[c].dtype != np.float64 for c in columns):
        return False
    bucket, busbw, total_us = (collectives[c].to_numpy() for c in columns)
    large = (bucket >= LARGE_MESSAGE_BYTES) & (busbw > 0) & (total_us > 0)
    return not (large & (collectives["op"].to_numpy() != "barrier")).any()


def _run_kind(per_rank: pd.DataFrame, traces) -> str:
    """"gpu" (NCCL expectations) or "cpu" (gloo): the traces' backend, else the breakdown's kind."""
    backends = {str(getattr(t, "backend", None) or "").lower() for t in traces or []} - {""}
    if backends & {"nccl", "rccl"}:
        return "gpu"
    if backends:
        return "cpu"
    if not per_rank.empty and "kind" in per_rank.columns and (per_rank["kind"] == "gpu").any():
        return "gpu"
    return "cpu"


def _backend(kind: str) -> str:
    return "NCCL on GPUs" if kind == "gpu" else "gloo on CPUs"


# ---- memory close to capacity -------------------------------------------------------------------
def _memory_near_capacity(per_rank: pd.DataFrame) -> list:
    """Ranks whose peak reserved memory (or, without it, NVML's peak used) exceeds
    MEMORY_NEAR_CAPACITY_PCT of the device's memory.
    """
    if per_rank.empty or "rank" not in per_rank.columns or _below_capacity(per_rank):
        return []
    table = per_rank.copy()
    reserved = pd.to_numeric(table.get("peak_reserved_pct"), errors="coerce") \
        if "peak_reserved_pct" in table.columns else pd.Series(np.nan, index=table.index)
    used = pd.to_numeric(table.get("device_used_pct"), errors="coerce") \
        if "device_used_pct" in table.columns else pd.Series(np.nan, index=table.index)
    table["used_pct"] = reserved.where(reserved.notna(), used)
    table["measure"] = np.where(reserved.notna(), "reserved by PyTorch", "in use (NVML)")
    near = table[table["used_pct"] > MEMORY_NEAR_CAPACITY_PCT]
    if near.empty:
        return []
    worst = near.loc[near["used_pct"].idxmax()]
    total = _number(worst, "device_total_bytes")
    peak = _number(worst, "peak_reserved_bytes") if worst["measure"] == "reserved by PyTorch" \
        else _number(worst, "peak_device_used_bytes")
    evidence = (f"{len(near)} rank(s) peak above {MEMORY_NEAR_CAPACITY_PCT:g}% of device memory; "
                f"worst rank {int(worst['rank'])}: {worst['used_pct']:.1f}% "
                f"{worst['measure']}")
    if _finite(peak) and _finite(total):
        evidence += f" ({peak / 2**30:.2f} of {total / 2**30:.2f} GiB)"
    allocated = _number(worst, "peak_allocated_bytes")
    if _finite(allocated):
        evidence += f", peak allocated {allocated / 2**30:.2f} GiB"
    evidence += "."
    suggestion = ("One allocation spike away from an out-of-memory error: free memory with "
                  "activation "
                  "checkpointing (torch.utils.checkpoint), a smaller micro-batch with gradient "
                  "accumulation, bf16 mixed precision, or sharded optimizer state (FSDP/ZeRO).")
    if (_finite(peak) and _finite(allocated) and _finite(total) and total > 0
            and (peak - allocated) / total * 100 > FRAGMENTATION_PCT):
        suggestion += (" Reserved exceeds allocated by "
                       f"{(peak - allocated) / total * 100:.0f}% of the device: the caching "
                       "allocator is fragmented; try "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
    return [_finding("memory near capacity", float("nan"), evidence, suggestion,
                     rank_list(near["rank"]))]


def _below_capacity(per_rank: pd.DataFrame) -> bool:
    """True where the memory columns are float64 (or absent) and no rank is near capacity: the
    finding's frame work is then left out; anything else is judged by it."""
    used = np.full(len(per_rank), np.nan)
    for column in ("device_used_pct", "peak_reserved_pct"):  # reserved, where known, first
        if column in per_rank.columns:
            if per_rank[column].dtype != np.float64:
                return False
            values = per_rank[column].to_numpy()
            used = np.where(np.isnan(values), used, values)
    return not (used > MEMORY_NEAR_CAPACITY_PCT).any()


def _number(row, column):
    try:
        return float(row[column])
    except (KeyError, TypeError, ValueError):
        return float("nan")
