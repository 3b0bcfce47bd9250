"""One rank's memory figures from the tracer's step records and memory profiles
(docs/memory.md defines each).

The series is one value per analysed step: on a GPU the peak memory allocated by PyTorch over the
step (`cuda_peak_allocated_bytes`), elsewhere the process's RSS near the step's end
(`rss_bytes`). From it: the peak, the growth (analysis.rank.memory_growth), and, where the device
is known, the headroom and the steps left before it is full at the growth's rate. The categories
at the peak are torch's memory profiler's (--profile-memory), from the window whose peak is the
highest. The figures are a RankMemory (analysis.core.contracts).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.core.contracts import MEASURE_CUDA, MEASURE_RSS, RankMemory
from analysis.rank.memory_growth import growth_of
from tracer import schema


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64)


def rank_series(steps: pd.DataFrame, analysed=None) -> tuple[str, pd.DataFrame] | None:
    """(measure, frame of step, value, reserved, total, at_end) over the rank's analysed
    steps, in step order; None without a memory value in any. `analysed`: the step numbers to
    keep (None: every step record's). `at_end` is the value at the step's end: the CUDA peak
    itself, or RSS interpolated at the end from the readings (rss_at_step_ends)."""
    if steps is None or not len(steps) or "step" not in steps.columns:
        return None
    frame = pd.DataFrame({
        "step": _column(steps, "step"), "end_ns": _column(steps, "end_ns"),
        "allocated": _column(steps, "cuda_peak_allocated_bytes"),
        "reserved": _column(steps, "cuda_peak_reserved_bytes"),
        "total": _column(steps, "cuda_total_bytes"),
        "rss": _column(steps, "rss_bytes"), "rss_t_ns": _column(steps, "rss_t_ns")})
    frame = frame[frame["step"].notna()].drop_duplicates("step", keep="last")
    frame = frame.sort_values("step", kind="stable")
    at_ends = rss_at_step_ends(frame)
    if analysed is not None:
        kept = frame["step"].isin(list(analysed)).to_numpy()
        frame, at_ends = frame[kept], at_ends[kept]
    measure = MEASURE_CUDA if frame["allocated"].notna().any() else MEASURE_RSS
    column = "allocated" if measure == MEASURE_CUDA else "rss"
    frame = frame.assign(at_end=frame[column] if measure == MEASURE_CUDA else at_ends)
    frame = frame[frame[column].notna()].rename(columns={column: "value"})
    if frame.empty:
        return None
    return measure, frame[["step", "value", "reserved", "total", "at_end"]].reset_index(
        drop=True)


def rss_at_step_ends(frame: pd.DataFrame) -> np.ndarray:
    """Each step's RSS at its end, interpolated linearly in time between the readings the
    step records carry (each once: steps between two readings share the earlier one, and the
    series would otherwise be a staircase that lags them; docs/memory.md, Growth); NaN for a
    step that ends before the first reading or after the last (its memory then is unknown: held
    flat, the steps after the last reading would end a rise with a plateau), the record's own
    value where the times are unknown."""
    values = frame["rss"].to_numpy()
    read, ends = frame["rss_t_ns"].to_numpy(), frame["end_ns"].to_numpy()
    known = ~(np.isnan(read) | np.isnan(values))
    if known.sum() < 2:
        return values.copy()
    times, first = np.unique(read[known], return_index=True)
    at_ends = np.interp(ends, times, values[known][first], left=np.nan, right=np.nan)
    return np.where(np.isnan(ends), values, at_ends)


def reading_points(steps: pd.DataFrame, analysed=None) -> tuple[np.ndarray, np.ndarray] | None:
    """(positions, values) of the distinct RSS readings the analysed steps' records carry,
    each where it was read among all the steps: a reading at fraction f of step k (from its
    start to its end) stands at k - 1 + f, the memory after step k - 1 and part of step k;
    None where the readings' or the steps' times are unknown."""
    needed = ("step", "start_ns", "end_ns", "rss_bytes", "rss_t_ns")
    if steps is None or not set(needed) <= set(steps.columns):
        return None
    every = pd.DataFrame({name: _column(steps, name) for name in needed}).dropna()
    every = every.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    ends = every["end_ns"].to_numpy()
    carried = every if analysed is None else every[every["step"].isin(list(analysed))]
    carried = carried.drop_duplicates("rss_t_ns")
    if len(carried) < 3 or np.any(np.diff(ends) < 0):
        return None
    read = carried["rss_t_ns"].to_numpy()  # placed among every step, analysed or not
    at = np.clip(np.searchsorted(ends, read), 0, len(ends) - 1)
    starts, step = every["start_ns"].to_numpy()[at], every["step"].to_numpy()[at]
    fraction = np.clip((read - starts) / np.maximum(ends[at] - starts, 1.0), 0.0, 1.0)
    return step - 1 + fraction, carried["rss_bytes"].to_numpy()


def _peak_profile(profiles: list) -> schema.MemoryProfileRecord | None:
    """The profile with the highest peak (the first of equal ones)."""
    best = None
    for record in profiles:
        if best is None or record.peak_bytes > best.peak_bytes:
            best = record
    return best


def _device_profiles(profiles: list, measure: str) -> list:
    """The rank's memory profiles of the measured device (CUDA or the host)."""
    return [r for r in profiles or () if r.device.startswith("cuda") == (measure == MEASURE_CUDA)]


def categories_growth(profiles: list) -> dict[str, float] | None:
    """Bytes a step each category gained between the peaks of the first and the last of
    `profiles` (one device's); None with fewer than two windows at different steps."""
    def at(record) -> int:
        return record.peak_step if record.peak_step is not None else record.last_step

    ordered = sorted(profiles, key=at)
    if len(ordered) < 2 or at(ordered[-1]) == at(ordered[0]):
        return None
    first, last = ordered[0], ordered[-1]
    span = at(last) - at(first)
    return {name: (last.categories.get(name, 0) - first.categories.get(name, 0)) / span
            for name in schema.MEMORY_CATEGORIES}


def _nan_max(values: np.ndarray) -> float:
    known = values[~np.isnan(values)]
    return float(known.max()) if len(known) else math.nan


def _steps_to_full(series: pd.DataFrame, total: float, growth: float) -> float:
    """Steps from the last one until the device is full at `growth` bytes a step: the room
    above the last step's reserved memory (else its allocated) over the rate."""
    if not growth > 0 or not total > 0:
        return math.nan
    last = series.iloc[-1]
    used = last["reserved"] if last["reserved"] == last["reserved"] else last["value"]
    return max(0.0, (total - float(used)) / growth)


def rank_memory(rank: int, steps: pd.DataFrame, profiles: list | None = None,
                analysed=None) -> RankMemory | None:
    """The rank's figures from its step records (`steps`, columns as tracer.schema.StepRecord)
    over the `analysed` steps, and its MemoryProfileRecords; None without a memory value."""
    found = rank_series(steps, analysed)
    if found is None:
        return None
    measure, series = found
    values = series["value"].to_numpy()
    at = int(np.argmax(values))
    reserved = _nan_max(series["reserved"].to_numpy())
    total = _nan_max(series["total"].to_numpy())
    used = reserved if reserved == reserved else float(values[at])
    headroom = (total - used) / total * 100 if total > 0 else math.nan
    growth = growth_of(series["step"].to_numpy(), series["at_end"].to_numpy(),
                       reading_points(steps, analysed) if measure == MEASURE_RSS else None)
    to_full = _steps_to_full(series, total, growth.bytes_per_step)
    last_step = int(series["step"].iloc[-1])
    profiles = _device_profiles(profiles, measure)
    profile = _peak_profile(profiles)
    return RankMemory(
        rank=int(rank), measure=measure, steps=len(series), first_step=int(series["step"].iloc[0]),
        last_step=last_step, peak_bytes=float(values[at]), peak_step=int(series["step"].iloc[at]),
        reserved_bytes=reserved, device_total_bytes=total, headroom_pct=headroom,
        growth_bytes_per_step=growth.bytes_per_step, growth_from_step=growth.from_step,
        noise_bytes=growth.noise_bytes, steps_to_full=to_full,
        full_at_step=last_step + math.ceil(round(to_full, 6)) if to_full == to_full else None,
        categories_at_peak=dict(profile.categories) if profile is not None else None,
        categories_steps=(profile.first_step, profile.last_step) if profile is not None
        else None,
        categories_peak_bytes=float(profile.peak_bytes) if profile is not None else math.nan,
        categories_growth_per_step=categories_growth(profiles))
