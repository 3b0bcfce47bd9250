"""Which ProfilerStep spans make the analysis window: --steps, HTA's selection, unfinished steps.

Pure functions on the steps frame (`step, start_ns, end_ns`) that analysis.ingest.load builds; the
rules are written in docs/definitions.md ("The analysis window: steps").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.model import StepsEnded
from analysis.core.step_spec import format_ranges

WHOLE_TRACE_STEP = -1  # the step number of the one window of a trace without ProfilerStep
# The tracer's step 0 holds the script's set-up (process group start, DDP's first broadcast and
# bucket rebuild): its records are set-up, never a training step's, which count from step 1.
FIRST_TRAINING_STEP = 1

# A last step this far from the median of the others is taken as unfinished or not a training
# step (a crash mid-step, evaluation after training) in a trace without the tracer's records.
SUSPECT_LONG = 1.5
SUSPECT_SHORT = 0.5
SUSPECT_MIN_OTHERS = 2


def step_at(times: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            numbers: np.ndarray) -> np.ndarray:
    """The number of the step whose [start, end) holds each time, NaN outside every step (and
    for a NaN time): steps given as arrays sorted by start."""
    if not len(starts):
        return np.full(len(times), np.nan)
    where = np.searchsorted(starts, times, side="right") - 1
    inside = (where >= 0) & (times < ends[np.clip(where, 0, None)])
    return np.where(inside, numbers[np.clip(where, 0, None)], np.nan)


def unfinished_steps(complete: pd.DataFrame, ended: StepsEnded | None, where: str
                     ) -> tuple[pd.DataFrame, list[str]]:
    """`complete` without the steps that never finished, and a problem naming each one.

    With the tracer's records, a step exists once its optimizer step (or tracer.step())
    ended: ProfilerSteps numbered after the last step known to have ended never did. Records
    cut short bound nothing: a complete trace's steps ended, whatever its records say. Without
    records, the last step is suspect: it is left out when it is longer than SUSPECT_LONG or
    shorter than SUSPECT_SHORT times the median of the others (with at least
    SUSPECT_MIN_OTHERS others).
    """
    if complete.empty:
        return complete, []
    if ended is not None:
        past = complete[complete["step"] > ended.last]
        if past.empty:
            return complete, []
        which = format_ranges(sorted(int(s) for s in past["step"]))
        if ended.cut_short:
            return complete, [
                f"{where}: ProfilerStep {which} is past what the tracer's records hold "
                f"({ended.said_by}), which the rank's death cut short (no run_end); the trace "
                f"is complete, so its steps are analysed"]
        return complete[complete["step"] <= ended.last], [
            f"{where}: ProfilerStep {which} never reached its step end (the tracer's "
            f"{ended.said_by}: the script ended or crashed during it); left out"]
    if len(complete) < SUSPECT_MIN_OTHERS + 1:
        return complete, []
    last = complete["start_ns"].idxmax()
    durations = complete["end_ns"] - complete["start_ns"]
    median = float(durations.drop(index=last).median())
    duration = float(durations[last])
    if SUSPECT_SHORT * median <= duration <= SUSPECT_LONG * median:
        return complete, []
    step = int(complete.loc[last, "step"])
    return complete.drop(index=last), [
        f"{where}: the last step, ProfilerStep#{step}, took {duration / 1e6:,.2f} ms against a "
        f"median of {median / 1e6:,.2f} ms for the others: taken as unfinished or not a training "
        f"step (a crash during it, or work after training) and left out; --steps {step} "
        f"analyses it"]


def select_steps(steps: pd.DataFrame, wanted: list[int] | None, hta_compatible: bool,
                 where: str, ended: StepsEnded | None = None
                 ) -> tuple[pd.DataFrame, list[str]]:
    """The analysis window's steps: every complete, finished step, `wanted` ones, or HTA's;
    `ended`: what the tracer's records say of which steps ended (None: no records)."""
    problems = []
    complete = steps[steps["end_ns"] > steps["start_ns"]]
    if len(complete) < len(steps):
        problems.append(f"{where}: {len(steps) - len(complete)} ProfilerStep spans have no "
                        f"duration and are left out")
    if hta_compatible and len(complete):
        # HTA keeps only what starts before the last ProfilerStep does.
        complete = complete[complete["start_ns"] < complete["start_ns"].max()]
    elif wanted is None:
        complete, found = unfinished_steps(complete, ended, where)
        problems += found
    if wanted is not None:
        present = set(complete["step"].tolist())
        missing = [s for s in wanted if s not in present]
        if missing:
            have = format_ranges(sorted(present)) if present else "none"
            which = f"steps {format_ranges(missing)} are" if len(missing) > 1 \
                else f"step {missing[0]} is"
            problems.append(f"{where}: {which} not in the trace (it has {have})")
        complete = complete[complete["step"].isin(wanted)]
    return complete.reset_index(drop=True), problems
