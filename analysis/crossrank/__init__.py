"""Cross-rank truth: every collective and p2p op matched across ranks on one clock, waiting split
from transfer, the rank that made the others wait, and pipeline bubbles (docs/cross-rank.md).

`analyse(...)` is pure (frames in, a CrossRank out: analysis.core.contracts); `cross_rank(run)`
adapts a LoadResult to it. The JSON document's `cross_rank` object is the report's
(analysis.report.json_document).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.contracts import CrossRank
from analysis.crossrank import findings as cross_findings
from analysis.crossrank.clock import clock_table, to_common_clock, unplaced_rows
from analysis.crossrank.culprit import STRAGGLER_COLUMNS, find_stragglers
from analysis.crossrank.matching import match_ops
from analysis.crossrank.pipeline import PIPELINE_COLUMNS, pipeline_bubbles, schedule_of
from analysis.crossrank.run_frames import run_frames
from analysis.crossrank.waits import (
    op_bandwidth,
    op_waits,
    rank_step_waits,
    transfer_bandwidth,
    with_unknown_waits,
)
from analysis.rank import pipeline_schedule


def analyse(ops: pd.DataFrame, steps: pd.DataFrame, clock_sync: pd.DataFrame, world_size: int,
            events: dict | None = None, work: pd.DataFrame | None = None,
            microbatches: int | None = None, virtual_stages: int = 1,
            reference: int = 0, trace_ranks: frozenset = frozenset()) -> CrossRank:
    """The cross-rank pass over `ops` and `steps` (each rank's own clock); `trace_ranks`: the
    ranks whose ops come from their Kineto trace alone. `pipeline_schedule` is the pipeline's
    stages, microbatches, virtual stages and theoretical bubble (crossrank.pipeline.
    schedule_of), None without p2p ops.

    `notes` are what the pass saw but cannot tell for sure (a rank whose clock is not known, a
    clock_sync that the collectives contradict, a rank last in every clean step in too few
    steps to rule out chance): Findings that are notes, shown apart from the findings and never
    ranked with them.

    The straggler and pipeline passes stand on the matched ops and fail alone: a pass that
    raises gives an empty frame, and `failed` names it with the error ({pass: "Type: message"},
    which analysis.run reports as one problem each)."""
    coverage = steps[["rank", "step"]] if len(steps) else None
    matched, mismatches = match_ops(ops, world_size, coverage, trace_ranks)
    ranks = set(ops["rank"]) | set(steps["rank"]) | {reference}
    clock = clock_table(matched, clock_sync, ranks, reference)
    # An instance with a member whose clock is not known cannot be placed in time: it is left
    # out of the waits (unknown, not 0) and names no straggler (docs/cross-rank.md, "One clock").
    unplaced = unplaced_rows(matched, clock)
    placed = (matched.assign(instance=np.where(unplaced, -1, matched["instance"]))
              if unplaced.any() else matched)
    common = to_common_clock(placed, clock)
    waits = op_bandwidth(op_waits(common))
    failed: dict[str, str] = {}
    stragglers = _alone("stragglers", failed, STRAGGLER_COLUMNS,
                        lambda: find_stragglers(waits, steps, events, clock))
    return CrossRank(
        clock=clock, ops=waits,
        waits=with_unknown_waits(rank_step_waits(waits, steps), matched[unplaced]),
        bandwidth=transfer_bandwidth(waits), stragglers=stragglers, mismatches=mismatches,
        pipeline=_alone("pipeline", failed, PIPELINE_COLUMNS,
                        lambda: pipeline_bubbles(waits, work, microbatches, virtual_stages)),
        pipeline_schedule=schedule_of(waits, microbatches, virtual_stages),
        notes=tuple(cross_findings.clock_notes(clock, matched[unplaced])
                    + cross_findings.too_few_steps(stragglers, waits)),
        failed=failed, steps=steps)


def _alone(name: str, failed: dict, columns: list[str], compute) -> pd.DataFrame:
    """compute(), or, where it raises, an empty frame of `columns` with failed[name] saying
    why: one pass's failure costs the cross-rank frames nothing else."""
    try:
        return compute()
    except Exception as exc:  # noqa: BLE001  (named in the report's problems)
        failed[name] = f"{type(exc).__name__}: {exc}"
        return pd.DataFrame(columns=columns)


def cross_rank(run, work: pd.DataFrame | None = None, microbatches: int | None = None,
               virtual_stages: int | None = None, steps: list[int] | None = None) -> CrossRank:
    """The cross-rank pass over a LoadResult (analyse's, with `kineto_shift_ns`: per rank, its
    Kineto clock minus its ops' clock); `work` is the breakdown's per-step frame (rank, step,
    step_ns, work_ns), needed for the pipeline bubbles only; `steps` (--steps) the analysed
    steps. Microbatches and virtual stages per rank come from the trace's `PP:` spans where it
    has them (analysis.rank.pipeline_schedule), else from the p2p ops."""
    frames = run_frames(run)
    if steps is not None:  # --steps: the selected steps only
        for name in ("ops", "steps"):
            frames[name] = frames[name][frames[name]["step"].isin(steps)].reset_index(drop=True)
    has_p2p = frames["ops"]["op"].isin(P2P_OPS).any()
    schedule = None
    if has_p2p and (microbatches is None or virtual_stages is None):
        schedule = pipeline_schedule.detect(run.ranks)
        microbatches = microbatches or schedule.microbatches
        virtual_stages = virtual_stages or schedule.stages_per_rank or 1
    result = analyse(frames["ops"], frames["steps"], frames["clock_sync"], frames["world_size"],
                     frames["events"], work, microbatches, virtual_stages or 1,
                     trace_ranks=frames["trace_ranks"])
    told = result.pipeline_schedule
    if told is not None and schedule is not None:
        # What the trace's spans tell of the schedule ("gpipe", "interleaved", "looped", None
        # for a schedule that opens none, such as 1F1B), and whether its backward is split.
        told = {**told, "kind": schedule.kind, "split_backward": schedule.split_backward}
    return dataclasses.replace(result, kineto_shift_ns=frames["kineto_shift"],
                               pipeline_schedule=told)
