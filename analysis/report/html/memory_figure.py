"""The HTML report's memory figure: memory over steps, one line per rank (docs/memory.md), from
what analysis.findings.memory_section computed."""

from __future__ import annotations

from analysis.core.contracts import MemorySection
from analysis.report.html import charts

FIGURE_MAX_RANKS = 12  # more ranks: the highest peaks, and the median rank, are drawn
FIGURE_MAX_POINTS = 1000  # points per line at most (every n-th step past that)


def _drawn_ranks(section: MemorySection) -> list[int]:
    ranks = sorted(section.series)
    if len(ranks) <= FIGURE_MAX_RANKS:
        return ranks
    peaks = {r["rank"]: r["peak_bytes"] for r in section.rows}
    highest = sorted(ranks, key=lambda r: -peaks.get(r, 0))[:FIGURE_MAX_RANKS - 1]
    median = section.rows[0]["median_rank"] if section.rows else None
    return sorted(set(highest) | ({median} if median in section.series else set()))


def memory_figure(section: MemorySection | None) -> str:
    """The HTML figure: memory over steps, one line per rank (MiB of each rank's measure)."""
    if section is None or not section.series:
        return '<p class="none">no memory figures: no step record of the tracer</p>'
    lines = []
    measures = {r["rank"]: r["measure"] for r in section.rows}
    for rank in _drawn_ranks(section):
        steps, values = section.series[rank]
        stride = max(1, len(steps) // FIGURE_MAX_POINTS)
        lines.append((f"rank {rank} {measures.get(rank, '')}", steps[::stride],
                      [v / (1 << 20) for v in values[::stride]]))
    shown = "" if len(lines) == len(section.series) else (
        f"<p>{len(lines)} of {len(section.series)} ranks: the highest peaks and the median "
        f"rank.</p>")
    return shown + charts.lines(lines, "step", "MiB")
