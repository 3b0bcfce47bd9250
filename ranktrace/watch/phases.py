"""Phases as they happen: an online change detector on the job's step time (docs/viewing.md,
"Phases").

The reference is the median m and the MAD of the last REFERENCE_STEPS steps of the current
phase. A step is out of it when |x - m| > max(K_MAD x 1.4826 x MAD, MIN_CHANGE x m,
MIN_CHANGE_MS). A new phase begins when, over the last steps that span at least
PERSIST_S seconds and PERSIST_STEPS steps, at least PERSIST_SHARE of them are out on the same
side (slower, or faster): it begins at the first of those, its reference their values. A lone
slow step (a collection, a checkpoint), or a burst of them shorter than PERSIST_S (another job
on the machine for a few seconds), never moves the reference, and steps out of it are left out
of it. Pure: steps in, changes out.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

REFERENCE_STEPS = 50
WARMUP_STEPS = 10  # steps of a phase's reference before any step is judged against it
K_MAD = 5.0
MIN_CHANGE = 0.2
MIN_CHANGE_MS = 0.2
PERSIST_STEPS = 20
PERSIST_S = 5.0
PERSIST_SHARE = 0.8


@dataclass(frozen=True)
class PhaseChange:
    """A phase that began at `step`: the step time went from `before_ms` to `after_ms`
    (medians)."""

    step: int
    before_ms: float
    after_ms: float


class PhaseDetector:
    def __init__(self):
        self.reference: deque[float] = deque(maxlen=REFERENCE_STEPS)
        self.window: deque[tuple[int, float, int]] = deque()  # (step, ms, side) newest last
        self.window_ms = 0.0
        self.sides = {-1: 0, 0: 0, 1: 0}
        self.changes: list[PhaseChange] = []

    def add(self, step: int, ms: float) -> PhaseChange | None:
        """Judge one step's time (steps in order); the change it completes, if any."""
        if len(self.reference) < WARMUP_STEPS:
            self.reference.append(ms)
            return None
        middle = statistics.median(self.reference)
        mad = statistics.median(abs(x - middle) for x in self.reference)
        band = max(K_MAD * 1.4826 * mad, MIN_CHANGE * middle, MIN_CHANGE_MS)
        side = 0 if abs(ms - middle) <= band else (1 if ms > middle else -1)
        if side == 0:
            self.reference.append(ms)
        self._push(step, ms, side)
        return self._change(middle)

    def _push(self, step: int, ms: float, side: int) -> None:
        self.window.append((step, ms, side))
        self.window_ms += ms
        self.sides[side] += 1
        while (len(self.window) > PERSIST_STEPS
               and self.window_ms - self.window[0][1] >= PERSIST_S * 1e3):
            _, old_ms, old_side = self.window.popleft()
            self.window_ms -= old_ms
            self.sides[old_side] -= 1

    def _change(self, middle: float) -> PhaseChange | None:
        if len(self.window) < PERSIST_STEPS or self.window_ms < PERSIST_S * 1e3:
            return None
        for side in (1, -1):
            if self.sides[side] >= PERSIST_SHARE * len(self.window):
                out = [(s, ms) for s, ms, d in self.window if d == side]
                values = [ms for _, ms in out]
                change = PhaseChange(step=out[0][0], before_ms=middle,
                                     after_ms=statistics.median(values))
                self.changes.append(change)
                self.reference = deque(values[-REFERENCE_STEPS:], maxlen=REFERENCE_STEPS)
                self.window.clear()
                self.window_ms = 0.0
                self.sides = {-1: 0, 0: 0, 1: 0}
                return change
        return None
