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
* rising by more than NOISE_FACTOR times the noise, by at least MIN_RISE_BYTES, and by at
  least MIN_RISE_SHARE of the memory it rose to (a creep of a few MiB in a process of hundreds
  is the allocator and the interpreter settling, not a leak);
* spread over the stretch: each half of it rises by at least SPREAD_SHARE of the whole (one
  jump, an allocation that stays, is not a growth).

Its rate is the least-squares slope over the stretch; it starts at the stretch's first step, or,
on RSS, where the line through the readings of the rise meets the level of the last reading
before it (knee_between_readings). Without one, the rate is 0 and there is no first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SERIES_STEPS = 20  # fewer steps tell no trend
MIN_SEGMENT_STEPS = 10  # no segment shorter than this: a trend needs several steps
MIN_GROWTH_STEPS = 20
NOISE_FACTOR = 4.0
MIN_RISE_BYTES = 4 << 20  # a rise under 4 MiB over the whole stretch is no leak worth naming
MIN_RISE_SHARE = 0.01  # nor one under 1% of the memory the stretch rose to
SPREAD_SHARE = 0.25
MERGE_SLOPE_SHARE = 0.5
# Noise below this is taken as this: RSS and the allocator move by pages and blocks, and a
# series that is flat to the byte would otherwise be cut at every page.
NOISE_FLOOR_BYTES = 256 << 10
PENALTY_FACTOR = 8.0  # x noise^2 x log(points): the cost a breakpoint must save
SMOOTHING_STEPS = 5  # the rolling median the noise is measured around
MAX_POINTS = 250  # a longer series is segmented on the medians of consecutive steps
KNEE_SPAN = 4  # readings up to this many reaches after the knee date it
KNEE_REFITS = 4  # the line through the rise fitted again from each knee, at most
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


def _rise_line(positions: np.ndarray, values: np.ndarray, low: float, high: float
               ) -> tuple[float, float, float] | None:
    """(slope, intercept, scatter) of the least-squares line through the readings in [low,
    high], the scatter being 1.4826 x the median absolute residual; None with fewer than three
    or a slope that does not rise."""
    kept = (positions >= low) & (positions <= high)
    if kept.sum() < 3 or np.ptp(positions[kept]) == 0:
        return None
    slope, intercept = np.polyfit(positions[kept], values[kept], 1)
    residuals = values[kept] - (slope * positions[kept] + intercept)
    scatter = 1.4826 * float(np.median(np.abs(residuals)))
    return (float(slope), float(intercept), scatter) if slope > 0 else None


def _back_projected(positions: np.ndarray, values: np.ndarray, line: tuple[float, float, float],
                    before: float, noise: float) -> float:
    """Where `line` (the rise), traced back from `before`, meets the level before it: the
    readings from the last one before `before` that stands above the line by more than the
    tolerance (one step's rise, 3 x the line's scatter, NOISE_FACTOR x the noise) on to the
    last that stays within the tolerance of it (on the line too, so read within about a step
    of the knee); the readings after, on the line or under it (a stair of the rise, one of its
    slow first steps), have risen. The knee is not before the level's last reading nor after
    the next; the first reading's position when every reading before lies on the line."""
    slope, intercept, scatter = line
    tolerance = max(slope, 3.0 * scatter, NOISE_FACTOR * noise)
    earlier = np.flatnonzero(positions < before)
    above = earlier[values[earlier] > slope * positions[earlier] + intercept + tolerance]
    if not len(above):
        return float(positions.min())
    level = int(above[-1])
    while level + 1 < len(positions) and positions[level + 1] < before \
            and values[level + 1] - values[level] <= tolerance:
        level += 1
    after = positions[level + 1] if level + 1 < len(positions) else before
    knee_at = (values[level] - intercept) / slope
    return float(min(max(knee_at, positions[level]), after))


def knee_between_readings(positions: np.ndarray, values: np.ndarray, around: float,
                          reach: float, noise: float) -> float:
    """Where a rise dated near `around` began, from the readings at their own `positions` (in
    steps, fractional: where each was read): the line through the readings of the rise (least
    squares, from a reach after `around` to KNEE_SPAN reaches on: surely risen), traced back
    to the level of the last reading before it that stands above it (_back_projected). The
    line is then fitted again from that knee on (the rise as it began, not as it went on later)
    until the knee stays within half a step. The readings after a rise that began between two
    readings so point back to the level before it, and a rise earlier in the run (a start-up's)
    is not taken for the level. `around` itself (not before the first reading) when the
    readings are too few to fit."""
    positions = np.asarray(positions, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(positions, kind="stable")
    positions, values = positions[order], values[order]
    span = KNEE_SPAN * reach
    line = (_rise_line(positions, values, around + reach, around + reach + span)
            or _rise_line(positions, values, around, around + span))
    if line is None:  # fewer than three readings to fit
        return max(around, float(positions.min())) if len(positions) else around
    knee_at = _back_projected(positions, values, line, around + reach, noise)
    for _ in range(KNEE_REFITS):
        line = _rise_line(positions, values, knee_at + 1e-9, knee_at + span)
        if line is None:
            break
        refitted = _back_projected(positions, values, line, knee_at + 1e-9, noise)
        if abs(refitted - knee_at) < 0.5:
            return refitted
        knee_at = refitted
    return knee_at


def _steady(steps: np.ndarray, values: np.ndarray, noise: float) -> bool:
    """The rising stretch is a steady rise (the module's doc)."""
    if len(steps) < MIN_GROWTH_STEPS:
        return False
    rise = _slope(steps, values) * np.ptp(steps)
    if rise < max(MIN_RISE_BYTES, NOISE_FACTOR * noise, MIN_RISE_SHARE * float(np.max(values))):
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
        start = knee_between_readings(positions, read, steps[first], max(2 * gap, 1.0),
                                      noise)
        start_step = int(np.ceil(start - 1e-9))
        first = int(np.searchsorted(steps, start_step))
    return Growth(_slope(steps[first:], values[first:]), start_step, noise)
