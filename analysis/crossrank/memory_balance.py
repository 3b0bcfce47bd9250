"""Memory across ranks: each rank's peak against the median rank's, and the categories that make
the difference (docs/memory.md, "Across ranks"); the `memory` table, one row per rank.

The median rank is a rank: the one in the middle when the ranks are ordered by peak, the lower
of the two middle ones for an even count (of two ranks, the lower one), so that "above the
median" is always against a peak some rank really had.
"""

from __future__ import annotations

import math

from analysis.core.contracts import RankMemory
from tracer import schema


def median_rank(figures: list[RankMemory]) -> RankMemory | None:
    """The median rank by peak (ties by rank number); None without figures."""
    if not figures:
        return None
    ordered = sorted(figures, key=lambda f: (f.peak_bytes, f.rank))
    return ordered[(len(ordered) - 1) // 2]


def category_differences(rank: RankMemory, median: RankMemory) -> list[tuple[str, float]]:
    """(category, bytes this rank's categories at peak hold above the median rank's), largest
    first, the categories both ranks have; [] where either has none."""
    if rank.categories_at_peak is None or median.categories_at_peak is None:
        return []
    differences = [(name, float(rank.categories_at_peak.get(name, 0)
                                - median.categories_at_peak.get(name, 0)))
                   for name in schema.MEMORY_CATEGORIES]
    return sorted(differences, key=lambda item: -item[1])


def _finite_or_none(value):
    if value is None or isinstance(value, (int, str, tuple, dict)):
        return value
    return float(value) if math.isfinite(value) else None


# The memory table's columns, in order (docs/memory.md); categories_at_peak is a dict of
# schema.MEMORY_CATEGORIES (the CSV and text tables spread it over one column each).
MEMORY_COLUMNS = ["rank", "measure", "steps", "first_step", "last_step", "peak_bytes",
                  "peak_step", "reserved_bytes", "device_total_bytes", "headroom_pct",
                  "growth_bytes_per_step", "growth_from_step", "steps_to_full", "full_at_step",
                  "peak_vs_median_bytes", "peak_vs_median_pct", "median_rank",
                  "categories_at_peak", "categories_steps", "noise_bytes"]


def memory_rows(figures: list[RankMemory]) -> list[dict]:
    """The memory table: one row per rank, in rank order, each figure of RankMemory with the
    rank's peak against the median rank's (bytes and % of that peak); None where unknown."""
    median = median_rank(figures)
    rows = []
    for figure in sorted(figures, key=lambda f: f.rank):
        above = figure.peak_bytes - median.peak_bytes
        row = {name: _finite_or_none(getattr(figure, name, None)) for name in MEMORY_COLUMNS
               if hasattr(figure, name)}
        row.update(peak_vs_median_bytes=above, median_rank=median.rank,
                   peak_vs_median_pct=(above / median.peak_bytes * 100
                                       if median.peak_bytes > 0 else None))
        row["categories_steps"] = (list(figure.categories_steps)
                                   if figure.categories_steps is not None else None)
        rows.append({name: row.get(name) for name in MEMORY_COLUMNS})
    return rows
