"""The late ranks of a run and why each is late: the ranks the cross-rank pass names (the
straggler rule's, and the pipeline stage that holds the others back), each tested by
analysis.findings.late_causes over the analysed steps; and the words the findings and the
verdict give them (docs/report.md, "Why a rank is late").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from analysis.core.contracts import CrossRank
from analysis.crossrank.culprit import MIN_SHARE_PCT
from analysis.findings.late_causes import (
    CONTENTION,
    LOW,
    MORE_WORK_RATIO,
    Cause,
    late_causes,
    more_work,
)
from analysis.findings.late_evidence import LateEvidence, late_evidence

ON_AVERAGE = "late on average"
# A rank not named late is tested where the others wait for it at least this many times as long
# as for any other rank, and for MIN_SHARE_PCT of the ranks' step time.
DOMINANT_FACTOR = 2.0
# The ranks not late whose traces the late ranks are compared with: the medians need a few.
OTHER_RANKS = 16

# How each cause opens the advice of a late rank: "Rank 1 is late because ..."
BECAUSE = {
    "larger inputs": "its inputs are larger than the other ranks'",
    "slower at equal inputs": "it runs the same ops on the same shapes slower than the others",
    CONTENTION: "the ranks compete for cores",
    "device throttling": "its device is throttled",
    "a different device or host": "it runs on a different device or host",
    "data loading": "it waits longer for its data",
    "work only this rank does": "it does work that no other rank does",
    "waiting outside the trace": "it waits on something outside the trace",
}


@dataclass(frozen=True)
class LateRank:
    """A late rank: how the cross-rank pass names it (`how`: "straggler", "pipeline stage", or
    ON_AVERAGE: no rank named, and the others wait for it most by far),
    its lateness per step (what each waiting rank waits for it, ms), the causes that hold,
    and for a pipeline stage its work over the other stages' (None where unknown)."""

    rank: int
    how: str
    late_ms: float
    causes: list[Cause] = field(default_factory=list)
    work_ratio: float | None = None
    tested: bool = True  # whether any profiled step of the rank was among the steps tested


def late_ranks(traces, cross_rank: CrossRank | None, steps) -> dict[int, LateRank]:
    """Every late rank of the run with its causes over `steps` (step numbers): the ranks the
    straggler rule names, the pipeline stage that holds the others back, and where neither is
    named, the rank the others wait for most where it dominates (DOMINANT_FACTOR)."""
    if cross_rank is None or not cross_rank.matched():
        return {}
    named: dict[int, tuple[str, float]] = {}
    members = max(cross_rank.ops["rank"].nunique() - 1, 1) if len(cross_rank.ops) else 1
    stragglers = cross_rank.stragglers
    if len(stragglers) and "fires" in stragglers:
        for row in stragglers[stragglers["fires"].astype(bool)].to_dict("records"):
            named[int(row["rank"])] = ("straggler", row["caused_wait_ms_per_step"] / members)
    pipeline = cross_rank.pipeline
    if pipeline is not None and len(pipeline) and "holds_back" in pipeline:
        stages = max(len(pipeline) - 1, 1)
        for row in pipeline[pipeline["holds_back"].astype(bool)].to_dict("records"):
            named.setdefault(int(row["rank"]), ("pipeline stage",
                                                row["caused_recv_wait_ms_per_step"] / stages))
    if not named and len(stragglers):
        # No rank named: the rank the others wait for most, where it dominates, is tested too,
        # for the causes with evidence of their own (never those found by elimination).
        order = stragglers.sort_values("caused_wait_ms_per_step", ascending=False)
        top = order.iloc[0]
        second = order["caused_wait_ms_per_step"].iloc[1] if len(order) > 1 else 0.0
        if (top["share_pct"] >= MIN_SHARE_PCT
                and top["caused_wait_ms_per_step"] >= DOMINANT_FACTOR * second):
            named[int(top["rank"])] = (ON_AVERAGE, top["caused_wait_ms_per_step"] / members)
    if not named:
        return {}
    evidence = late_evidence(traces, set(named), OTHER_RANKS)
    steps = [int(s) for s in steps]
    host = evidence.host
    traced = (set(host.loc[host["step"].astype("int64").isin(steps), "rank"].astype(int))
              if len(host) else set())
    found = {rank: LateRank(rank, how, float(late),
                            late_causes(rank, steps, evidence, late,
                                        by_elimination=how != ON_AVERAGE,
                                        stage=how == "pipeline stage"),
                            more_work(rank, steps, evidence) if how == "pipeline stage" else None,
                            tested=rank in traced)
             for rank, (how, late) in named.items()}
    return {rank: kept for rank, kept in ((rank, said_late(item)) for rank, item in found.items())
            if kept is not None}


def said_late(item: LateRank) -> LateRank | None:
    """The late rank as the run names it: a rank the cross-rank pass names, as tested; a rank
    late only on average, with the causes of more than low confidence alone, and not at all
    where none holds. Low confidence says a rank was slower but not why: on a shared host the
    scheduler can give that to any rank of a clean run, which must stay quiet."""
    if item.how != ON_AVERAGE:
        return item
    causes = [cause for cause in item.causes if cause.confidence != LOW]
    return replace(item, causes=causes) if causes else None


def causes_text(late: LateRank) -> str:
    """The causes that hold, with their confidence and proof, as one sentence each."""
    return " ".join(f"Why: {c.cause} ({c.confidence} confidence): {c.proof}"
                    for c in late.causes)


def causes_advice(late: LateRank) -> str:
    """The advice of each cause that holds, the first led by the rank and its cause."""
    seen, parts = set(), []
    for cause in late.causes:
        if cause.advice in seen:
            continue
        seen.add(cause.advice)
        parts.append(cause.advice)
    if not parts:
        return ""
    because = BECAUSE.get(late.causes[0].cause, f"of {late.causes[0].cause}")
    lead = f"Rank {late.rank} is late because {because}: "
    return lead + parts[0][0].lower() + parts[0][1:] + "".join(" " + p for p in parts[1:])


def stage_text(late: LateRank | None) -> tuple[str, str] | None:
    """(evidence, suggestion) of the pipeline stage that holds the others back: layers are to
    move off it only where it has more work than the other stages (MORE_WORK_RATIO); else the
    causes' advice. None where nothing is known of it (the finding keeps its own words)."""
    if late is None:
        return None
    rank, ratio = late.rank, late.work_ratio
    work = (f" Its compute work, each op priced at the ranks' common speed, is {ratio:.2f}x the "
            f"other stages' median." if ratio is not None and not math.isnan(ratio) else "")
    evidence = (work + (" " + causes_text(late) if late.causes else "")).strip()
    if ratio is not None and ratio >= MORE_WORK_RATIO:
        return evidence, (f"Rank {rank}'s stage holds the others back with {ratio:.2f}x their "
                          f"work: move layers off it to balance the stages.")
    if late.causes:
        advice = causes_advice(late)
        return evidence, (f"Rank {rank}'s stage holds the others back without more work than "
                          f"theirs: do not move layers; " + advice[0].lower() + advice[1:])
    if ratio is not None:
        return evidence, (f"Rank {rank}'s stage holds the others back without more work than "
                          f"theirs, and no cause tested holds: do not move layers; compare its "
                          f"host with the others'.")
    return None


def straggler_text(late: LateRank | None) -> tuple[str, str] | None:
    """(evidence, suggestion) of a late rank named by the straggler rule where some cause holds:
    the causes' proof and their advice, in place of the list of what to compare."""
    if late is None or (not late.causes and not late.tested):
        return None
    if not late.causes:
        return ("Why: no cause tested holds in its profiled steps (larger inputs, slower at equal "
                "inputs, data loading, work only it does, waiting outside the trace).",
                f"Rank {late.rank} is late, but no cause tested holds in its profiled steps: "
                f"trace the steps in which it is late (a longer window with --active, or "
                f"--capture-slow-steps) to tell why.")
    return causes_text(late), causes_advice(late)


def cause_rows(late: dict[int, LateRank]) -> list[dict]:
    """One row per late rank and cause that holds (Cause.row, with how the rank is late)."""
    return [{**cause.row(), "late_as": item.how, "late_ms_per_step": round(item.late_ms, 3)}
            for item in late.values() for cause in item.causes]


def stage_work(traces, steps):
    """A function of a rank: its compute work over the other stages' (more_work) over `steps`,
    None where the traces hold no ops to tell; the evidence read once, on first use."""
    evidence: list[LateEvidence] = []

    def work(rank: int) -> float | None:
        if not evidence:
            evidence.append(late_evidence(traces))
        return more_work(rank, [int(s) for s in steps], evidence[0])
    return work
