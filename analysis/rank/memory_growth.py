"""A rank's memory growth over its steps: a steady rise found by change points and slope, not by
noise (docs/memory.md, "Growth").

The series (one value a step: the CUDA allocated peak, or RSS) must first reach memory the rank
never held before: its level at the end stands above every level before its last quarter by
more than NEW_MEMORY_FACTOR times its noise (a plateau, a sawtooth, a bump that went do not).
Then it is cut where its trend changes, by ruptures' binary segmentation under a continuous
piecewise-linear cost (over at most MAX_POINTS medians of consecutive steps); a breakpoint must
pay a penalty that grows with the noise, so that the allocator's jitter and the repeated RSS
readings cut nothing. The growth is the last stretch of rising segments (a segment joins it
while its slope is at least MERGE_SLOPE_SHARE of the stretch's), its first step placed to the
step by the least-squares knee nearby, and kept only when it is a steady rise:

* at least MIN_GROWTH_STEPS steps long;
* rising by more than NOISE_FACTOR times the noise, and by at least MIN_RISE_BYTES;
* spread over the stretch: each half of it rises by at least SPREAD_SHARE of the whole (one
  jump, an allocation that stays, is not a growth).

Its rate is the least-squares slope over the stretch; it starts at the stretch's first step.
Without one, the rate is 0 and there is no first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SERIES_STEPS = 20  # fewer steps tell no trend
MIN_SEGMENT_STEPS = 10  # no segment shorter than this: a trend needs several steps
MIN_GROWTH_STEPS = 20
NOISE_FACTOR = 4.0
MIN_RISE_BYTES = 4 << 20  # a rise under 4 MiB over the whole stretch is no leak worth naming
SPREAD_SHARE = 0.25
MERGE_SLOPE_SHARE = 0.5
# Noise below this is taken as this: RSS and the allocator move by pages and blocks, and a
# series that is flat to the byte would otherwise be cut at every page.
NOISE_FLOOR_BYTES = 256 << 10
PENALTY_FACTOR = 8.0  # x noise^2 x log(points): the cost a breakpoint must save
SMOOTHING_STEPS = 5  # the rolling median the noise is measured around
MAX_POINTS = 250  # a longer series is segmented on the medians of consecutive steps
KNEE_GRID = 257  # knee positions tried between readings
KNEE_SPAN = 4  # readings up to this many reaches after the knee date it
SMOOTHING_WINDOW = 10  # levels compared by the new-memory test: medians of this many steps
NEW_MEMORY_FACTOR = 2.0


@dataclass(frozen=True)
class Growth:
    """A rank's growth: `bytes_per_step` (0.0 without a steady rise), `from_step` (None
    without one), and the noise (bytes) the rise was judged against."""

    bytes_per_step: float
    from_step: int | None
    noise_bytes: float


NO_GROWTH = Growth(0.0, None, float("nan"))


def noise_of(values: np.ndarray) -> float:
    """The series' noise in bytes: 1.4826 x the median absolute deviation of its distance
    from its rolling median of SMOOTHING_STEPS steps (a robust standard deviation that a trend
    leaves alone), at least NOISE_FLOOR_BYTES."""
    if len(values) < SMOOTHING_STEPS:
        return NOISE_FLOOR_BYTES
    half = SMOOTHING_STEPS // 2
    padded = np.pad(values, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, SMOOTHING_STEPS)
    residuals = values - np.median(windows, axis=1)
    mad = np.median(np.abs(residuals - np.median(residuals)))
    return max(float(1.4826 * mad), NOISE_FLOOR_BYTES)


def reaches_new_memory(values: np.ndarray, noise: float) -> bool:
    """The series ends above everything it held before its last quarter (at least its last
    MIN_GROWTH_STEPS steps): the median of its last SMOOTHING_WINDOW steps stands more than
    NEW_MEMORY_FACTOR x noise above the highest median of SMOOTHING_WINDOW steps before."""
    recent = max(MIN_GROWTH_STEPS, len(values) // 4)
    if len(values) < recent + SMOOTHING_WINDOW:
        return False
    end = float(np.median(values[-SMOOTHING_WINDOW:]))
    windows = np.lib.stride_tricks.sliding_window_view(values[:-recent], SMOOTHING_WINDOW)
    return end - float(np.median(windows, axis=1).max()) > NEW_MEMORY_FACTOR * noise


def _binned(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(steps, values, steps per point): the series as at most MAX_POINTS points, each the
    median of consecutive steps (their median step)."""
    size = -(-len(values) // MAX_POINTS)
    if size == 1:
        return steps, values, 1
    cut = len(values) // size * size
    shape = (-1, size)
    return (np.median(steps[:cut].reshape(shape), axis=1),
            np.median(values[:cut].reshape(shape), axis=1), size)


def breakpoints(values: np.ndarray, noise: float, min_size: int = MIN_SEGMENT_STEPS
                ) -> list[int]:
    """The indices where each segment ends (the last is len(values)), continuous piecewise
    linear (ruptures.Binseg, model "clinear")."""
    import ruptures

    n = len(values)
    if n < 2 * min_size:
        return [n]
    search = ruptures.Binseg(model="clinear", min_size=min_size)
    return search.fit(values / noise).predict(pen=PENALTY_FACTOR * np.log(n))


def _slope(steps: np.ndarray, values: np.ndarray) -> float:
    if len(steps) < 2 or np.ptp(steps) == 0:
        return 0.0
    return float(np.polyfit(steps, values, 1)[0])


def _rising_start(steps: np.ndarray, values: np.ndarray, ends: list[int], noise: float
                  ) -> int | None:
    """The index where the last stretch of rising segments starts; None when the last segment
    does not rise (by more than NOISE_FACTOR x noise)."""
    starts = [0, *ends[:-1]]
    first, slope = None, 0.0
    for start, end in reversed(list(zip(starts, ends))):
        segment_slope = _slope(steps[start:end], values[start:end])
        rise = segment_slope * np.ptp(steps[start:end])
        if rise <= NOISE_FACTOR * noise or (first is not None
                                            and segment_slope < MERGE_SLOPE_SHARE * slope):
            break
        first = start
        slope = _slope(steps[first:], values[first:])
    return first


def _hinge_errors(steps: np.ndarray, values: np.ndarray, knees: np.ndarray) -> np.ndarray:
    """The least-squares error of `values` against a + b * max(0, step - knee), per knee."""
    x = np.maximum(0.0, steps[None, :] - knees[:, None])
    x -= x.mean(axis=1, keepdims=True)
    y = values - values.mean()
    sxx = np.einsum("ij,ij->i", x, x)
    sxy = x @ y
    explained = np.divide(sxy * sxy, sxx, out=np.zeros_like(sxy), where=sxx > 0)
    return float(y @ y) - explained


def knee(steps: np.ndarray, values: np.ndarray, around: int, reach: int) -> int:
    """The index in [around - reach, around + reach] where a line flat before it and rising
    after it fits the series from `around - 2 * reach` to `around + KNEE_SPAN * reach` best
    (least squares; the rise as it began, not its average over the run): every `stride`-th
    index first, then each index near the best of those."""
    low = max(0, around - 2 * reach)
    lo, hi = max(low, around - reach), min(len(values) - 2, around + reach)
    if hi < lo:
        return around
    x, y = steps[low:around + KNEE_SPAN * reach], values[low:around + KNEE_SPAN * reach]
    stride = max(1, (hi - lo) // 32)
    coarse = np.arange(lo, hi + 1, stride)
    best = int(coarse[np.argmin(_hinge_errors(x, y, steps[coarse]))])
    fine = np.arange(max(lo, best - stride), min(hi, best + stride) + 1)
    return int(fine[np.argmin(_hinge_errors(x, y, steps[fine]))])


def knee_between_readings(positions: np.ndarray, values: np.ndarray, around: float,
                          reach: float) -> float:
    """The knee of a line flat before it and rising after it, fitted by least squares to the
    readings at their own `positions` (in steps, fractional: where each was read) from
    `around - reach` to `around + KNEE_SPAN * reach` (the rise near its start, not its average
    over the run; not the creep long before it), searched on a grid of KNEE_GRID positions
    within `reach` of `around`: the step where a rise that began between two readings began, as
    the readings after it point back to the level before it."""
    kept = (positions >= around - reach) & (positions <= around + KNEE_SPAN * reach)
    if kept.sum() < 3:
        return around
    # no knee before the first reading: nothing before it shows the level the rise left
    low = max(around - reach, float(positions.min()))
    grid = np.linspace(low, max(low, around + reach), KNEE_GRID)
    return float(grid[np.argmin(_hinge_errors(positions[kept], values[kept], grid))])


def _steady(steps: np.ndarray, values: np.ndarray, noise: float) -> bool:
    """The rising stretch is a steady rise (the module's doc)."""
    if len(steps) < MIN_GROWTH_STEPS:
        return False
    rise = _slope(steps, values) * np.ptp(steps)
    if rise < max(MIN_RISE_BYTES, NOISE_FACTOR * noise):
        return False
    middle = len(steps) // 2
    halves = ((steps[:middle + 1], values[:middle + 1]), (steps[middle:], values[middle:]))
    return all(_slope(s, v) * np.ptp(s) >= SPREAD_SHARE * rise for s, v in halves)


def growth_of(steps, values, readings: tuple | None = None) -> Growth:
    """The growth of one rank's memory series: `steps` (step numbers, ascending) and their
    `values` (bytes); NaN values are left out. `readings`: (positions, values) of the readings
    the values were interpolated from, each where it was read (fractional steps; RSS): the
    growth's first step is then the first whole step at or after their knee
    (knee_between_readings)."""
    steps = np.asarray(steps, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    known = ~(np.isnan(steps) | np.isnan(values))
    steps, values = steps[known], values[known]
    if len(values) < MIN_SERIES_STEPS:
        return NO_GROWTH
    noise = noise_of(values)
    if not reaches_new_memory(values, noise):
        return Growth(0.0, None, noise)
    binned_steps, binned, size = _binned(steps, values)
    binned_noise = noise_of(binned)
    ends = breakpoints(binned, binned_noise, max(2, MIN_SEGMENT_STEPS // size))
    start = _rising_start(binned_steps, binned, ends, binned_noise)
    if start is None:
        return Growth(0.0, None, noise)
    first = knee(steps, values, start * size, 2 * size + MIN_SEGMENT_STEPS // 2)
    if not _steady(steps[first:], values[first:], noise):
        return Growth(0.0, None, noise)
    start_step = int(steps[first])
    if readings is not None:
        positions, read = (np.asarray(a, dtype=np.float64) for a in readings)
        gap = float(np.median(np.diff(positions))) if len(positions) > 1 else 1.0
        start = knee_between_readings(positions, read, steps[first], max(2 * gap, 1.0))
        start_step = int(np.ceil(start - 1e-9))
        first = int(np.searchsorted(steps, start_step))
    return Growth(_slope(steps[first:], values[first:]), start_step, noise)
