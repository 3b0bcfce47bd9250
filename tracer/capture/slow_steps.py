"""When a step is slow, and which windows every rank opens: the rules, on plain numbers.

`SlowStepRule` watches one rank's step times (docs/tracer.md, Capturing slow steps): after
WARMUP_STEPS, a step that takes at least `factor` times the median of the last HISTORY steps
before it triggers a window, at most `max_captures` times per run and never within the cool-down
after a window. Steps inside a profiler window are neither judged nor counted (the profiler
slows them). `CapturePlan` decides, from the ordered list of requests every rank reads alike,
which windows are opened: every rank takes the same decisions from the same list.
"""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass

HISTORY = 64  # steps the running median is taken over
WARMUP_STEPS = 5  # first steps never judged nor counted (start-up, DDP's bucket rebuild)
MIN_HISTORY = 5  # steps in the median before a step is judged
COOLDOWN_WINDOWS = 2  # after a window, this many window lengths pass before the next trigger
MARGIN_STEPS = 3  # the fewest steps between a trigger and its window's first warm-up step
# And at least this long at the pace of the steps since the slow one: every rank reads the
# request within one step-end worker pass (tracer.steps.step_worker.PERIOD_S, 0.2 s) of its writing.
MARGIN_S = 0.5
# On demand, at the pace of the last steps: the request may come through files of a shared file
# system, which other machines may see later.
ON_DEMAND_MARGIN_S = 1.0


@dataclass(frozen=True)
class Trigger:
    step: int
    ratio: float  # the step's time / the running median
    median_ns: float


class SlowStepRule:
    """One rank's trigger: `observe(step, duration_ns, in_window)` for each step, in order."""

    def __init__(self, factor: float, max_captures: int, window_steps: int):
        self.factor = factor
        self.max_captures = max_captures
        self.cooldown = COOLDOWN_WINDOWS * window_steps
        self.windows = 0  # windows opened, on this rank's trigger or another's (note_window)
        self._quiet: list[tuple[int, int]] = []  # (from, to): steps never judged slow
        self._last_first = -1  # the first step of the latest window
        self._recent: collections.deque = collections.deque()
        self._sorted: list[int] = []

    @property
    def median_ns(self) -> float | None:
        n = len(self._sorted)
        if n == 0:
            return None
        mid = n // 2
        return float(self._sorted[mid]) if n % 2 else (self._sorted[mid - 1]
                                                         + self._sorted[mid]) / 2

    def observe(self, step: int, duration_ns: int, in_window: bool = False) -> Trigger | None:
        if step < WARMUP_STEPS or in_window:
            return None
        median = self.median_ns
        self._remember(duration_ns)
        if (median is None or len(self._sorted) <= MIN_HISTORY or median <= 0
                or (self.windows >= self.max_captures and step >= self._last_first)
                or any(lo <= step <= hi for lo, hi in self._quiet)):
            return None
        ratio = duration_ns / median
        if ratio < self.factor:
            return None
        self._quiet.append((step, step + self.cooldown))
        return Trigger(step, ratio, median)

    def note_window(self, first_step: int, last_step: int) -> None:
        """A window was opened (on any rank's trigger): no trigger from its first step to the
        end of its cool-down. Steps before it may still trigger (once each cool-down), even past
        the bound: this rank's steps are judged a pass behind, and its own slow step, earlier
        than the one that opened the window, is what names the rank that slowed first."""
        self.windows += 1
        self._last_first = max(self._last_first, first_step)
        self._quiet.append((first_step, last_step + self.cooldown))

    def _remember(self, duration_ns: int) -> None:
        self._recent.append(duration_ns)
        bisect.insort(self._sorted, duration_ns)
        if len(self._recent) > HISTORY:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]


def margin_steps(median_ns: float | None, margin_s: float = MARGIN_S) -> int:
    """Steps from now to a window's first warm-up step, so that every rank learns it first."""
    if not median_ns or median_ns <= 0:
        return MARGIN_STEPS
    return max(MARGIN_STEPS, math.ceil(margin_s * 1e9 / median_ns))


def place_window(first: int, steps: int, warmup: int, fixed_action, idle,
                 search: int = 10_000) -> int | None:
    """The first step >= `first` at which a window of `steps` traced steps after `warmup`
    warm-up steps keeps one idle step clear of the fixed schedule's windows on either side
    (`fixed_action(k)` is torch.profiler.schedule's action at step k); None within `search`."""
    for start in range(first, first + search):
        if all(fixed_action(k) == idle
               for k in range(max(start - warmup - 1, 0), start + steps + 1)):
            return start
    return None


@dataclass(frozen=True)
class Decision:
    accepted: bool
    why: str = ""  # why not


class CapturePlan:
    """Which requested windows are opened, decided from the requests in the one order every
    rank reads them: a slow-step window within the cool-down of a window already accepted (on
    either side of it), past the bound, or overlapping one is not opened; an on-demand window
    is opened unless it overlaps one."""

    def __init__(self, max_captures: int, window_steps: int, warmup: int):
        self.max_captures = max_captures
        self.cooldown = COOLDOWN_WINDOWS * window_steps
        self.warmup = warmup
        self.slow_accepted = 0
        self.windows: list[tuple[int, int]] = []  # (first warm-up step, last traced step)

    def decide(self, trigger: str, first_step: int, steps: int) -> Decision:
        start, last = first_step - self.warmup, first_step + steps - 1
        if steps < 1 or first_step < 0:
            return Decision(False, f"no steps to trace ({first_step}, {steps})")
        for begin, end in self.windows:
            if start <= end + 1 and begin <= last + 1:  # not one idle step between them
                return Decision(False, f"it overlaps the window of steps {begin + self.warmup}-"
                                       f"{end}")
        if trigger == "slow_step":
            if self.slow_accepted >= self.max_captures:
                return Decision(False, f"--max-captures {self.max_captures} reached")
            # Either side of a window: a request decided later may be for earlier steps (its
            # margin taken at a slower pace), and is then no less a second slowdown.
            for begin, end in self.windows:
                if start <= end + self.cooldown and begin <= last + self.cooldown:
                    return Decision(False, f"within the cool-down of {self.cooldown} steps of "
                                           f"the window of steps {begin + self.warmup}-{end}")
            self.slow_accepted += 1
        self.windows.append((start, last))
        return Decision(True)
