"""Bottleneck findings that only the cross-rank pass can make (docs/report.md): "ranks wait for
rank R", exposed transfer (exposed communication without the waiting for peers), and the pipeline
bubble per stage against the schedule's theory.

Each function takes the analysed per-step rows of analysis.findings.bottlenecks and the result of
`analysis.crossrank.cross_rank` (a CrossRank), and returns Findings (analysis.core.contracts).
"""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import CrossRank, Finding
from analysis.crossrank.clock import COLLECTIVES, NONE
from analysis.crossrank.culprit import MIN_SHARE_PCT, steps_needed


def matched(result: CrossRank | None) -> bool:
    """Whether the cross-rank pass matched any op: its findings then replace the per-rank ones."""
    return result is not None and result.matched()


def peer_wait_ns(steps: pd.DataFrame, result: CrossRank) -> pd.Series:
    """wait_for_peers per analysed (rank, step) row of `steps`, in ns (0 where none)."""
    waits = result.waits[["rank", "step", "wait_for_peers_ms"]]
    keyed = steps[["rank", "step"]].astype("int64").merge(
        waits.astype({"rank": "int64", "step": "int64"}), on=["rank", "step"], how="left")
    return keyed["wait_for_peers_ms"].fillna(0).to_numpy() * 1e6


def exposed_transfer_ns(steps: pd.DataFrame, result: CrossRank) -> pd.Series:
    """Exposed communication minus the time spent waiting for peers, per analysed row: a rank
    waiting for a late peer computes nothing, so that wait is exposed; the rest is transfer."""
    exposed = steps["exposed_comm_ns"].fillna(0).to_numpy()
    return pd.Series((exposed - peer_wait_ns(steps, result)).clip(min=0), index=steps.index)


def ranks_wait_for(steps: pd.DataFrame, result: CrossRank, why=None) -> list[Finding]:
    """One finding per rank that passes the straggler threshold (docs/cross-rank.md); `why`
    (rank -> (evidence, suggestion) or None) gives the causes that hold for a rank, tested by
    the findings stage (analysis.findings.late_ranks): they replace the list of what to
    compare."""
    stragglers = result.stragglers
    if stragglers.empty:
        return []
    findings = []
    for row in stragglers[stragglers["fires"].astype(bool)].to_dict("records"):
        rank = int(row["rank"])
        collectives = "; ".join(
            f"{c['op']} on pg {c['pg']} {c['size_bucket']} ({c['caused_wait_ms']:.1f} ms in "
            f"{c['instances']} instances)" for c in row["collectives"])
        doing, suggestion = _what_it_did(rank, row["evidence"])
        tested = why(rank) if why is not None else None
        if tested is not None:
            doing, suggestion = f"{doing} {tested[0]}", tested[1]
        evidence = (f"The other ranks wait {row['caused_wait_ms_per_step']:.2f} ms per step for "
                    f"rank {rank} ({row['share_pct']:.1f}% of the ranks' step time), in "
                    f"{collectives}. {doing}")
        victims = sorted(set(int(r) for r in result.ops["rank"]) - {rank})
        findings.append(Finding(f"ranks wait for rank {rank}", float(row["share_pct"]),
                                evidence, suggestion,
                                ", ".join(str(r) for r in victims) or str(rank)))
    return findings


def too_few_steps(stragglers: pd.DataFrame, ops: pd.DataFrame) -> list[Finding]:
    """A note per rank that arrived last in every clean step, in too few steps to be named
    (`stragglers` and `ops`: the pass's): the cross-rank result's `notes` (never a finding: a
    note names no bottleneck and is not ranked with the findings)."""
    if stragglers.empty or "too_few_steps" not in stragglers or ops.empty:
        return []
    members = len(set(int(r) for r in ops["rank"]))
    needed = steps_needed(members)
    notes = []
    for row in stragglers[stragglers["too_few_steps"].astype(bool)].to_dict("records"):
        rank, clean = int(row["rank"]), int(row["clean_steps"])
        evidence = (f"Rank {rank} was the last to arrive in all {clean} clean steps (the others "
                    f"waited {row['caused_wait_ms_per_step']:.2f} ms per step for it, "
                    f"{row['share_pct']:.1f}% of the ranks' step time), but {clean} steps cannot "
                    f"tell a late rank from chance with {members} ranks: naming one takes "
                    f"{needed} clean steps, {needed + 1} traced.")
        suggestion = (f"Record at least {needed + 1} steps with matched collectives: the "
                      f"tracer's comm records hold every step's (DDP's buckets too, unless "
                      f"--no-flight-recorder or --no-comms), or trace a longer profiler window "
                      f"(--active {needed + 1}) or more windows (--windows).")
        notes.append(Finding(f"too few steps to name rank {rank} late", float(row["share_pct"]),
                             evidence, suggestion, str(rank), note=True))
    return notes


def clock_notes(clock: pd.DataFrame, unplaced: pd.DataFrame) -> list[Finding]:
    """Notes on the clock (docs/cross-rank.md, "One clock"): a rank whose clock is not known
    while it met others in collectives (`unplaced`: those ops), and a rank whose clock_sync the
    collectives contradict (its estimate is used)."""
    notes = []
    by_rank = clock.set_index("rank")
    unknown = sorted({int(r) for r in unplaced["rank"]} & set(
        int(r) for r in by_rank.index[by_rank["source"] == NONE]))
    if unknown:
        named = ", ".join(str(r) for r in unknown)
        steps = unplaced["step"].nunique()
        evidence = (f"Rank(s) {named} have no clock_sync record and no matched collective with a "
                    f"known end (their ops are timed at issue only, and no profiled step times "
                    f"them), so their clocks cannot be put on rank 0's. Waiting for peers cannot "
                    f"be told from transfer in the {steps} step(s) in which they met other "
                    f"ranks in a collective, and no rank is named late from them.")
        suggestion = ("Keep the profiler window on (the default): its steps time the "
                      "collectives, which place each rank's clock; and check why the tracer "
                      "recorded no clock_sync (it is measured right after init_process_group; "
                      "its error line says why it was not).")
        notes.append(Finding(f"clock of rank(s) {named} unknown", evidence=evidence,
                             suggestion=suggestion, ranks=named, note=True))
    rejected = by_rank[(by_rank["source"] == COLLECTIVES)
                       & by_rank["clock_sync_offset_ns"].notna()]
    for rank, row in rejected.iterrows():
        sync_ms = row["clock_sync_offset_ns"] / 1e6
        evidence = (f"Rank {rank}'s clock_sync puts its clock {sync_ms:.3f} ms from rank 0's, "
                    f"its collectives' completions "
                    f"{row['estimate_offset_ns'] / 1e6:.3f} ms (+- "
                    f"{row['uncertainty_ns'] / 1e6:.3f} ms, {int(row['instances'])} instances, "
                    f"ends from the {row['estimate_from'] or 'ops'}). clock_sync's offset would "
                    f"have an op complete on one member before another member issued it, so the "
                    f"collectives' estimate is used.")
        suggestion = ("A clock that stepped or drifted after clock_sync was measured (NTP "
                      "adjusting it during a long job), or a sync that went wrong: check the "
                      "hosts' time synchronisation (chronyc tracking, timedatectl).")
        notes.append(Finding(f"clock_sync of rank {rank} disagrees with its collectives",
                             evidence=evidence, suggestion=suggestion, ranks=str(rank),
                             note=True))
    return notes


def _what_it_did(rank: int, evidence: dict) -> tuple[str, str]:
    """What the late rank did while the others waited, and the advice that follows from it."""
    base = (f"Find what only rank {rank} does before its collectives: compare its host with "
            f"the others (CPU frequency, other processes on its cores, core pinning), its data "
            f"shard (longer sequences, larger images) and work only it does (logging, "
            f"checkpointing, evaluation).")
    if not evidence.get("traced_windows"):
        return ("No profiled window covers the waits, so what the rank did is not known.", base)
    top = evidence.get("top_ops") or []
    loading = evidence.get("data_loading_ms") or 0.0
    outside = evidence.get("outside_ops_ms") or 0.0
    ops_text = ", ".join(f"{o['name']} {o['ms']:.1f} ms" for o in top[:3]) or "no op"
    doing = (f"In the {evidence['traced_windows']} profiled windows in which the others waited, "
             f"rank {rank} ran {ops_text}; data loading {loading:.1f} ms; "
             f"{outside:.1f} ms outside every op (Python between ops, or idle).")
    top_ms = top[0]["ms"] if top else 0.0
    if loading >= max(outside, top_ms):
        return doing, (f"Rank {rank} is late loading data: raise its DataLoader num_workers, "
                       f"pin memory and prefetch, or balance the shards. ") + base
    if outside >= top_ms:
        return doing, (f"Rank {rank} is late in Python or host work outside torch ops: profile "
                       f"its host code (py-spy) between the steps' ops. ") + base
    return doing, (f"Rank {rank} is late in {top[0]['name']}: compare that op's time with the "
                   f"other ranks' (a slow kernel, a larger input). ") + base


def pipeline_stages(result: CrossRank, stage=None) -> list[Finding]:
    """The pipeline bubble per stage, measured against the schedule's theory, naming the stage
    that holds the others back (docs/cross-rank.md, "Pipeline bubbles"); `stage` (rank ->
    (evidence, suggestion) or None) says whether that stage has more work or why else it is
    late (analysis.findings.late_ranks.stage_text): layers are moved off it only where it has
    more work."""
    table = result.pipeline
    if table is None or table.empty:
        return []
    per = table.set_index("rank")
    share = float(per["measured_bubble_pct"].mean())
    if share < MIN_SHARE_PCT:
        return []
    listed = "; ".join(
        f"rank {r}: bubble {row['measured_bubble_pct']:.1f}% (theory "
        f"{row['theory_bubble_pct']:.1f}%), recv wait {row['recv_wait_pct']:.1f}%, transfer "
        f"{row['transfer_pct']:.1f}%, idle {row['idle_pct']:.1f}%"
        for r, row in per.iterrows())
    evidence = (f"{len(per)} pipeline stages spend {share:.1f}% of each step not computing "
                f"({listed}).")
    holders = per[per["holds_back"].astype(bool)]
    suggestion = ("Bring the measured bubble towards the theory: raise the number of "
                  "microbatches, or use an interleaved or zero-bubble schedule.")
    if len(holders):
        holder = int(holders.index[0])
        evidence += (f" The other stages wait {holders.iloc[0]['caused_recv_wait_ms_per_step']:.2f}"
                     f" ms per step for rank {holder}'s sends.")
        tested = stage(holder) if stage is not None else None
        if tested is not None:
            evidence += f" {tested[0]}" if tested[0] else ""
            suggestion = f"{tested[1]} {suggestion}"
        else:
            suggestion = (f"Rank {holder}'s stage holds the others back: move layers off it to "
                          f"balance the stages. " + suggestion)
    return [Finding("pipeline bubble", share, evidence, suggestion,
                    ", ".join(str(int(r)) for r in per.index))]
