"""The run's phases as a table (docs/definitions.md, "Phases"): one row per phase, as the text
and HTML reports show it, and the step time per rank over the run that the HTML report draws
with the phases marked."""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import Phase

PHASE_TABLE_COLUMNS = ["steps", "count", "share_pct", "step_ms", "late_rank", "late_ms",
                       "waits", "what_if"]
MAX_RANK_LINES = 8  # more ranks: their median and slowest step time are drawn instead
MAX_DRAWN_STEPS = 1000  # more steps: drawn as the means of consecutive steps


def phase_table(phases: list[Phase]) -> pd.DataFrame:
    """One row per phase: its steps ("2000-2099"), how many, its share of the run's time, its
    mean step, the late rank and the wait it causes per step, each rank's wait per step and
    the top what-if answer on its steps, in words."""
    rows = []
    for phase in phases:
        answer = phase.what_if
        rows.append({
            "steps": f"{phase.first_step}-{phase.last_step}", "count": phase.steps,
            "share_pct": phase.share_pct, "step_ms": phase.step_ms,
            "late_rank": "" if phase.late_rank is None else str(phase.late_rank),
            "late_ms": phase.late_ms_per_step,
            "waits": ", ".join(f"rank {r} {v['wait_ms']:.2f}" for r, v in sorted(
                phase.ranks.items()) if v.get("wait_ms") is not None),
            "what_if": "" if not answer else (
                f"{answer['change']}: {answer['predicted_step_ms']:.2f} ms per step "
                f"(-{answer['saved_ms_per_step']:.2f})")})
    return pd.DataFrame(rows, columns=PHASE_TABLE_COLUMNS)


def step_time_lines(per_step: pd.DataFrame) -> list[tuple[str, list[float], list[float]]]:
    """(label, steps, step ms) per rank over every analysed step (with more than
    MAX_RANK_LINES ranks: the ranks' median and slowest), at most MAX_DRAWN_STEPS points each
    (the means of consecutive steps, at their mean step)."""
    rows = per_step[["rank", "step", "step_ns"]].apply(pd.to_numeric, errors="coerce").dropna()
    if rows.empty:
        return []
    grid = rows.pivot_table(index="step", columns="rank", values="step_ns").sort_index() / 1e6
    if grid.shape[1] > MAX_RANK_LINES:
        grid = pd.DataFrame({"median of ranks": grid.median(axis=1),
                             "slowest rank": grid.max(axis=1)})
    else:
        grid.columns = [f"rank {int(r)}" for r in grid.columns]
    size = -(-len(grid) // MAX_DRAWN_STEPS)
    if size > 1:
        bins = pd.Series(range(len(grid)), index=grid.index) // size
        steps = pd.Series(grid.index.to_numpy(dtype="float64")).groupby(bins.to_numpy()).mean()
        grid = grid.groupby(bins.to_numpy()).mean().set_index(steps.to_numpy())
    xs = [float(x) for x in grid.index]
    return [(str(label), xs, grid[label].tolist()) for label in grid.columns]
