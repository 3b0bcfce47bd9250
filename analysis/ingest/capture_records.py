"""The capture windows of a run (tracer.schema.CaptureRecord), one entry per window across ranks.

Every rank writes one `capture` record per window it learnt of (docs/trace-format.md, Capture
windows); they are grouped here by window (trigger, first step, length). What a window says of
its trigger (rank, step, ratio) is what most ranks recorded; ranks that disagree are named in a
problem. Which ranks traced it is read from their step records (`in_profiler_window` over every
traced step), not from their word: a rank whose step records are missing is in neither list.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from analysis.core.model import RunRecords
from analysis.ingest.records import read_records, record_ranks
from tracer import schema


def _traced_steps(records: RunRecords) -> set[int] | None:
    steps = records.steps
    if steps is None or steps.empty or "in_profiler_window" not in steps.columns:
        return None
    profiled = steps["in_profiler_window"].fillna(False).astype(bool)
    return set(steps.loc[profiled, "step"].astype(int).tolist())


def group_captures(records: dict[int, RunRecords]) -> tuple[list[dict], list[str]]:
    """(the run's capture windows, problems) from each rank's records. Each window:
    {trigger, rank, step, ratio, first_step, steps, ranks_with_window, ranks_missed}: `rank`,
    `step` and `ratio` those of the slow step (None on demand), `steps` the traced step numbers,
    `ranks_with_window` the ranks whose step records have every one of them in a profiler
    window, `ranks_missed` the ranks that said they learnt of it too late; in step order."""
    windows: dict[tuple, list[tuple[int, schema.CaptureRecord]]] = {}
    for rank, rank_records in sorted(records.items()):
        if rank_records is None:
            continue
        for record in rank_records.manifest:
            if isinstance(record, schema.CaptureRecord) and record.steps is not None \
                    and record.first_step is not None:
                key = (record.first_step, record.steps, record.trigger)
                windows.setdefault(key, []).append((rank, record))
    traced = {rank: _traced_steps(r) for rank, r in records.items() if r is not None}
    found, problems = [], []
    for (first, length, trigger), said in sorted(windows.items()):
        told = Counter((r.trigger_rank, r.trigger_step, r.ratio) for _, r in said)
        (trigger_rank, trigger_step, ratio), _ = told.most_common(1)[0]
        if len(told) > 1:
            others = sorted(rank for rank, r in said
                            if (r.trigger_rank, r.trigger_step, r.ratio)
                            != (trigger_rank, trigger_step, ratio))
            problems.append(f"capture window of steps {first}-{first + length - 1}: ranks "
                            f"{others} name another trigger than the others' (rank "
                            f"{trigger_rank}, step {trigger_step}); the most ranks' is used")
        steps = list(range(first, first + length))
        found.append({
            "trigger": trigger,
            "rank": trigger_rank if trigger == "slow_step" else None,
            "step": trigger_step,
            "ratio": ratio if trigger == "slow_step" else None,
            "first_step": first,
            "steps": steps,
            "ranks_with_window": sorted(rank for rank, seen in traced.items()
                                        if seen is not None and seen.issuperset(steps)),
            "ranks_missed": sorted({rank for rank, r in said if r.missed}),
        })
    return found, problems


def read_captures(run_dir: Path) -> tuple[list[dict], list[str]]:
    """group_captures() of the run folder `run_dir`, its records read here."""
    records, problems = {}, []
    for rank in sorted(record_ranks(run_dir)):
        rank_records, found = read_records(run_dir, rank)
        problems += found
        if rank_records is not None:
            records[rank] = rank_records
    windows, grouped = group_captures(records)
    return windows, problems + grouped
