"""When a rank's steps have turned slow, and which windows every rank opens: the rules, on plain
numbers (docs/tracer.md, Capturing slow steps).

`SlowStepRule` watches one rank's step times. A step is slow when it takes at least `factor`
times the median of the rank's recent steps and lies beyond their noise (NOISE_SIGMAS robust
standard deviations, from their median absolute deviation). One slow step is not a change: a
count goes up by one at each slow step and down by one at each other step (a CUSUM of the slow
steps), and a change is confirmed once it reaches PERSIST_STEPS while the steps since it left
zero have lasted PERSIST_S; back at zero, the steps were noise. The change began at the first of
those steps that took at least the midpoint between the median before it and the level it
reached (the median of the PERSIST_STEPS steps that confirmed it): steps slowed less just before
it ran into it, a burst of the machine's, not its start. Its size is the median of its steps
from there. A confirmed change becomes the new reference (the median restarts from its steps),
so a slow phase is one change, and its end and a later slowdown are judged against it. Steps
inside a profiler window (the profiler slows them) and the step after one are neither judged
nor counted.

`CapturePlan` decides, from the ordered list of requests every rank reads alike, which windows
are opened: every rank takes the same decisions from the same list. `place_window` finds the
first steps clear of the fixed schedule's windows.
"""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass

HISTORY = 64  # steps the running median and its deviation are taken over
WARMUP_STEPS = 5  # first steps never judged nor counted (start-up, DDP's bucket rebuild)
MIN_HISTORY = 8  # steps in the median before a step is judged (a deviation of fewer is luck)
# A slow step lies at least this many robust standard deviations (1.4826 x the median absolute
# deviation) above the median, as well as `factor` times it: on a noisy machine the factor
# alone would call its ordinary spread slow.
NOISE_SIGMAS = 5.0
MAD_TO_SIGMA = 1.4826
# A change: the count of slow steps less other steps reaches this, over at least PERSIST_S of
# steps. A scheduling hiccup, a collection or a page-cache miss slows one or two steps; a burst
# of them on fast steps (time slices on a loaded core) lasts some milliseconds: on 1 ms steps of
# this project's 2-core machine with two busy processes beside the two ranks, the longest
# burst counted 12 over 0.08 s (docs/tracer.md, Capturing slow steps).
PERSIST_STEPS = 4
PERSIST_S = 0.3
# What a step that is not slow takes off the count: a change is a run of steps of which more
# than two in three are slow. A core shared with another busy process in time slices slows
# about every other fast step (and the run's records show it); a slower rank, loader or device
# slows every one.
FAST_WEIGHT = 2
RECOMPUTE_EVERY = 8  # steps taken into the median between two computations of the threshold
COOLDOWN_WINDOWS = 2  # slow-step requests within this many window lengths are one slowdown
MARGIN_STEPS = 3  # the fewest steps between a request and its window's first warm-up step
# And at least this long at the pace of the steps since the change: every rank's capture thread
# reads the request list every tracer.capture.capture_watch.PERIOD_S (0.1 s).
MARGIN_S = 0.25
# On demand, at the pace of the last steps: the ask may come through files of a shared file
# system, which other machines may see later.
ON_DEMAND_MARGIN_S = 1.0
# A request for a window further than this past its trigger step is not one a rank wrote.
MAX_LEAD_STEPS = 100_000


@dataclass(frozen=True)
class Change:
    """A confirmed slowdown of one rank's steps."""

    step: int  # its first slow step
    confirmed_step: int  # the step at which it was confirmed
    ratio: float  # the first slow step's time / the median before
    factor: float  # the median of the change's steps / the median before
    before_ns: float  # the median before the change
    after_ns: float  # the median of the change's steps


class _Candidate:
    """The steps since the count of slow steps left zero."""

    def __init__(self, step: int, duration_ns: int):
        self.step = step
        self.first_duration_ns = duration_ns
        self.count = 1
        self.total_ns = duration_ns
        self.durations: collections.deque = collections.deque([duration_ns], maxlen=HISTORY)
        self.steps: collections.deque = collections.deque([step], maxlen=HISTORY)

    def add(self, step: int, duration_ns: int, slow: bool) -> None:
        self.count += 1 if slow else -FAST_WEIGHT
        self.total_ns += duration_ns
        self.durations.append(duration_ns)
        self.steps.append(step)

    def first_step_at(self, level_ns: float) -> tuple[int, int]:
        """(step, duration) of the first of its steps that took at least `level_ns`: where
        the change proper began, after the steps slowed less that ran into it (a burst of
        the machine's just before a slower loader, say). Its first step where the steps kept
        are not all of its own (the deque is full) or none took that long."""
        if len(self.steps) < HISTORY:
            for step, duration in zip(self.steps, self.durations):
                if duration >= level_ns:
                    return step, duration
        return self.step, self.first_duration_ns

    def durations_from(self, first: int) -> list[int]:
        """The durations of its steps from `first` on (all it kept, where `first` is its own
        first step)."""
        return [d for step, d in zip(self.steps, self.durations) if step >= first]


class SlowStepRule:
    """One rank's trigger: `observe(step, duration_ns, in_window)` for each step, in order."""

    def __init__(self, factor: float):
        self.factor = factor
        self._recent: collections.deque = collections.deque()
        self._sorted: list[int] = []
        self._threshold: float | None = None  # None: too few steps to judge
        self._since_threshold = 0
        self._candidate: _Candidate | None = None
        self._quiet: list[tuple[int, int]] = []  # (from, to): steps neither judged nor counted

    @property
    def median_ns(self) -> float | None:
        return _median(self._sorted)

    @property
    def threshold_ns(self) -> float | None:
        """The time from which a step is slow; None until MIN_HISTORY steps are in the median."""
        return self._threshold

    def observe(self, step: int, duration_ns: int, in_window: bool = False) -> Change | None:
        if step < WARMUP_STEPS or in_window or self._is_quiet(step):
            return None
        threshold = self._threshold
        if threshold is None:
            self._remember(duration_ns)
            return None
        slow = duration_ns >= threshold
        candidate = self._candidate
        if candidate is None:
            if slow:
                self._candidate = _Candidate(step, duration_ns)
            else:
                self._remember(duration_ns)
            return None
        candidate.add(step, duration_ns, slow)
        if candidate.count <= 0:  # noise: its steps join the median
            self._candidate = None
            for duration in candidate.durations:
                self._remember(duration)
            return None
        if candidate.count < PERSIST_STEPS or candidate.total_ns < PERSIST_S * 1e9:
            return None
        before = self.median_ns
        # The level it reached: that of the steps that confirmed it (a burst before it may be
        # most of the counted steps).
        reached = _median(sorted(list(candidate.durations)[-PERSIST_STEPS:]))
        first, duration = candidate.first_step_at((before + reached) / 2)
        # The change's own steps: its size and the new reference leave out the burst before it.
        own = candidate.durations_from(first)
        after = _median(sorted(own))
        change = Change(first, step, duration / before, after / before, before, after)
        self._restart(own)
        return change

    def note_window(self, open_step: int, last_step: int) -> None:
        """A window will profile steps open_step..last_step (warm-up and traced): they and the
        step after them are neither judged nor counted, whoever asked for it."""
        self._quiet.append((open_step, last_step + 1))

    def _is_quiet(self, step: int) -> bool:
        quiet = self._quiet
        while quiet and quiet[0][1] < step:
            quiet.pop(0)
        return any(lo <= step <= hi for lo, hi in quiet)

    def _restart(self, durations) -> None:
        """The change is the reference from now on: the median starts again from its steps."""
        self._candidate = None
        self._recent.clear()
        self._sorted.clear()
        self._threshold = None
        for duration in durations:
            self._remember(duration)

    def _remember(self, duration_ns: int) -> None:
        self._recent.append(duration_ns)
        bisect.insort(self._sorted, duration_ns)
        if len(self._recent) > HISTORY:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._since_threshold += 1
        if self._threshold is None or self._since_threshold >= RECOMPUTE_EVERY:
            self._threshold = self._compute_threshold()

    def _compute_threshold(self) -> float | None:
        self._since_threshold = 0
        values = self._sorted
        if len(values) < MIN_HISTORY:
            return None
        median = _median(values)
        deviation = _median(sorted(abs(v - median) for v in values))
        return max(self.factor * median, median + NOISE_SIGMAS * MAD_TO_SIGMA * deviation)


def _median(values) -> float | None:
    """The median of sorted `values`; None when empty."""
    n = len(values)
    if n == 0:
        return None
    mid = n // 2
    return float(values[mid]) if n % 2 else (values[mid - 1] + values[mid]) / 2


def margin_steps(pace_ns: float | None, margin_s: float = MARGIN_S) -> int:
    """Steps from now to a window's first warm-up step, so that every rank learns it first."""
    if not pace_ns or pace_ns <= 0:
        return MARGIN_STEPS
    return max(MARGIN_STEPS, math.ceil(margin_s * 1e9 / pace_ns))


def place_window(first: int, steps: int, warmup: int, fixed_action, idle,
                 search: int = 10_000) -> int | None:
    """The first step >= `first` at which a window of `steps` traced steps after `warmup`
    warm-up steps keeps one idle step clear of the fixed schedule's windows on either side
    (`fixed_action(k)` is torch.profiler.schedule's action at step k); None within `search`.
    Each step is looked at about once: past a busy step, the next start that clears it."""
    start, end = first, first + search
    while start < end:
        busy = next((k for k in range(max(start - warmup - 1, 0), start + steps + 1)
                     if fixed_action(k) != idle), None)
        if busy is None:
            return start
        start = max(start + 1, busy + warmup + 2)
    return None


@dataclass(frozen=True)
class Decision:
    accepted: bool
    why: str = ""  # why not


class CapturePlan:
    """Which requested windows are opened, decided from the requests in the one order every
    rank reads them. None is opened that is out of range (no steps, more than
    `max_window_steps`, before its trigger step or too far past it) or overlaps one already
    opened. A slow-step window is not opened for a change that began within the cool-down of
    one a window was opened for (the same slowdown, seen by another rank), nor past the budget:
    `max_captures` in all, the last of them only for a change larger than any opened before."""

    def __init__(self, max_captures: int, window_steps: int, warmup: int,
                 max_window_steps: int):
        self.max_captures = max_captures
        self.cooldown = COOLDOWN_WINDOWS * window_steps
        self.warmup = warmup
        self.max_window_steps = max_window_steps
        self.slow_accepted = 0
        self.largest_factor = 0.0  # of the slow-step windows opened
        self.slow_triggers: list[int] = []  # the steps their changes began
        self.windows: list[tuple[int, int]] = []  # (first warm-up step, last traced step)

    def decide(self, trigger: str, trigger_step: int, first_step: int, steps: int,
               factor: float | None = None) -> Decision:
        out_of_range = self._out_of_range(trigger_step, first_step, steps)
        if out_of_range:
            return Decision(False, out_of_range)
        start, last = first_step - self.warmup, first_step + steps - 1
        for begin, end in self.windows:
            if start <= end + 1 and begin <= last + 1:  # not one idle step between them
                return Decision(False, f"it overlaps the window of steps {begin + self.warmup}-"
                                       f"{end}")
        if trigger == "slow_step":
            why = self._same_slowdown(trigger_step) or self._over_budget(factor or 0.0)
            if why:
                return Decision(False, why)
            self.slow_accepted += 1
            self.largest_factor = max(self.largest_factor, factor or 0.0)
            self.slow_triggers.append(trigger_step)
        self.windows.append((start, last))
        return Decision(True)

    def _out_of_range(self, trigger_step: int, first_step: int, steps: int) -> str:
        if steps < 1:
            return f"no steps to trace ({steps})"
        if steps > self.max_window_steps:
            return f"{steps} steps, more than --max-window-steps {self.max_window_steps}"
        if trigger_step < 0 or first_step - self.warmup < 0:
            return f"steps before the run's first ({first_step}, asked at step {trigger_step})"
        if first_step < trigger_step or first_step - trigger_step > MAX_LEAD_STEPS:
            return (f"its first step {first_step} is not within {MAX_LEAD_STEPS} steps after "
                    f"the step it was asked at ({trigger_step})")
        return ""

    def _same_slowdown(self, trigger_step: int) -> str:
        """Another rank's view of a slowdown a window was opened for: its change began within
        the cool-down of that window's (either side: the ranks' requests come in any order)."""
        for seen in self.slow_triggers:
            if abs(trigger_step - seen) <= self.cooldown:
                return (f"the slowdown from step {seen} has its window (changes that began "
                        f"within {self.cooldown} steps of each other are one)")
        return ""

    def _over_budget(self, factor: float) -> str:
        if self.slow_accepted >= self.max_captures:
            return f"--max-captures {self.max_captures} reached"
        if (self.slow_accepted == self.max_captures - 1 and self.slow_accepted > 0
                and factor <= self.largest_factor):
            return (f"the last of --max-captures {self.max_captures} is kept for a change "
                    f"larger than {self.largest_factor:.3g}x")
        return ""
