"""What the findings cannot rank: the ranks that never communicated, and the notes.

A world size above 1 in which no rank issued a collective or p2p op is a finding of its own
("ranks train alone"): no step time is at stake, but the run does not do what a distributed run
is for. Notes say what the analysis could not tell (too few steps to name a late rank, data that
is missing); they are kept apart from the findings and carry no share of step time
(docs/report.md, "Notes").
"""

from __future__ import annotations

import math
from numbers import Integral

import pandas as pd

from analysis.core.contracts import NOTE_COLUMNS, CrossRank, Finding
from analysis.findings.labels import rank_list
from tracer import schema

ALONE = "ranks train alone"


def empty_notes() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in NOTE_COLUMNS})


def _starts(traces) -> list:
    return [r for t in traces or [] if getattr(t, "records", None) is not None
            for r in t.records.manifest if isinstance(r, schema.RunStart)]


def world_size(traces) -> int | None:
    """The run's world size: the largest the traces or the tracer's manifests give."""
    sizes = [getattr(t, "world_size", None) for t in traces or []]
    sizes += [s.world_size for s in _starts(traces)]
    sizes = [int(s) for s in sizes if isinstance(s, Integral) and s > 0]
    return max(sizes) if sizes else None


def collective_seen(collectives: pd.DataFrame | None, traces,
                    cross_rank: CrossRank | None) -> bool:
    """Whether any rank issued a collective or p2p op: a group with a count in the collectives
    table, a comms record, or an op the cross-rank pass read."""
    if collectives is not None and not collectives.empty:
        counts = (pd.to_numeric(collectives["count"], errors="coerce").fillna(0)
                  if "count" in collectives.columns else pd.Series(1, index=collectives.index))
        if (counts > 0).any():
            return True
    for trace in traces or []:
        records = getattr(trace, "records", None)
        comms = getattr(records, "comms", None)
        if comms is not None and len(comms):
            return True
    return bool(cross_rank is not None and len(cross_rank.ops))


def comms_recorded(traces) -> bool:
    """Whether the tracer recorded every rank's collectives (its comms records were on): with
    them off, only the profiled windows could show a collective."""
    starts = _starts(traces)
    if not starts:
        return False
    return not any(isinstance(s.config, dict) and s.config.get("no_comms") for s in starts)


def ranks_alone(steps: pd.DataFrame, collectives, traces, cross_rank) -> list[Finding]:
    """The "ranks train alone" finding: world size above 1, every rank's collectives recorded
    and none issued. share_pct is NaN (no step time is at stake) and it sorts first."""
    world = world_size(traces)
    if world is None or world < 2 or steps.empty or not comms_recorded(traces):
        return []
    if collective_seen(collectives, traces, cross_rank):
        return []
    ranks = sorted({int(r) for r in steps["rank"]})
    evidence = (f"The run has world size {world}, yet none of its {len(ranks)} analysed rank(s) "
                f"issued a collective or p2p op in any step: neither the tracer's records of "
                f"every collective nor the profiled steps hold one. Each rank trained alone on its "
                f"own copy of the model; no gradient was averaged and no rank waited for another.")
    suggestion = ("Check that the script joins the ranks: torch.distributed.init_process_group "
                  "and a DistributedDataParallel or FSDP model (or the library's equivalent). A "
                  "launcher or library that picks no distributed backend leaves each process "
                  "alone: with Hugging Face Accelerate check accelerator.num_processes and "
                  "accelerator.state.distributed_type (Accelerator(cpu=True) or a config without "
                  "a multi-process set-up gives NO), and launch with `accelerate launch` set up "
                  "for several processes. If the ranks are meant to train apart, run them as "
                  "separate runs.")
    return [Finding(ALONE, math.nan, evidence, suggestion, rank_list(ranks))]


def find_notes(per_step: pd.DataFrame | None, collectives, traces,
               cross_rank: CrossRank | None = None) -> pd.DataFrame:
    """What the analysis could not tell, one row per note (NOTE_COLUMNS), in a fixed order: the
    cross-rank pass's notes (a clock not known, ranks late in too few steps to be named, ...),
    collectives that cannot be told apart from none (comms records off), and ranks missing from
    the analysis."""
    notes = list(cross_rank.notes) if cross_rank is not None else []
    world = world_size(traces)
    analysed = (sorted({int(r) for r in pd.to_numeric(per_step["rank"], errors="coerce").dropna()})
                if per_step is not None and "rank" in per_step.columns else [])
    if (world is not None and world > 1 and analysed and not comms_recorded(traces)
            and not collective_seen(collectives, traces, cross_rank)):
        notes.append(Finding(
            "no collective traced, and collectives were not recorded", evidence=
            f"World size {world}, but no collective or p2p op is in the profiled steps and the "
            f"tracer's records of every collective were off (--no-comms) or absent: whether the "
            f"ranks communicated at all is not known.",
            suggestion="Trace again without --no-comms to tell ranks that train alone from "
                       "collectives outside the profiled steps.", note=True))
    if world is not None and analysed and len(analysed) < world:
        notes.append(Finding(
            f"{len(analysed)} of {world} ranks analysed",
            evidence=f"Only rank(s) {rank_list(analysed)} of world size {world} have analysed "
                     f"steps: who waits for whom among the others is not known.",
            suggestion="Analyse every rank's files together (the whole run folder).",
            ranks=rank_list(analysed), note=True))
    if not notes:
        return empty_notes()
    return pd.DataFrame([note.note_row() for note in notes], columns=NOTE_COLUMNS)
