"""The job's step time over the whole run, in a bounded number of buckets (the sparkline's).

Each bucket holds the mean of `span` consecutive steps; when MAX_BUCKETS are full, neighbours
are merged in pairs and `span` doubles, so a run of any length takes at most MAX_BUCKETS."""

from __future__ import annotations

MAX_BUCKETS = 512


class StepSeries:
    def __init__(self):
        self.buckets: list[list[float]] = []  # [sum of ms, steps]
        self.span = 1
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.low = float("inf")
        self.high = 0.0

    def add(self, step: int, ms: float) -> None:
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        self.low, self.high = min(self.low, ms), max(self.high, ms)
        if self.buckets and self.buckets[-1][1] < self.span:
            self.buckets[-1][0] += ms
            self.buckets[-1][1] += 1
            return
        if len(self.buckets) == MAX_BUCKETS:
            self.buckets = [[a[0] + b[0], a[1] + b[1]]
                            for a, b in zip(self.buckets[::2], self.buckets[1::2])]
            self.span *= 2
            if self.buckets[-1][1] < self.span:
                self.buckets[-1][0] += ms
                self.buckets[-1][1] += 1
                return
        self.buckets.append([ms, 1])

    def means(self, width: int) -> list[float]:
        """The run in `width` values at most, each the mean step time of its part."""
        if not self.buckets:
            return []
        if len(self.buckets) <= width:
            return [total / n for total, n in self.buckets]
        per = len(self.buckets) / width
        out = []
        for i in range(width):
            part = self.buckets[int(i * per):max(int((i + 1) * per), int(i * per) + 1)]
            out.append(sum(b[0] for b in part) / sum(b[1] for b in part))
        return out
