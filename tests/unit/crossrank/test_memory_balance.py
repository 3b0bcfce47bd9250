"""Memory across ranks (analysis.crossrank.memory_balance): the median rank is a rank, the lower
middle one for an even count; each row's peak against it; the categories that differ."""

from __future__ import annotations

import math

from analysis.core.contracts import RankMemory
from analysis.crossrank.memory_balance import (
    MEMORY_COLUMNS,
    category_differences,
    median_rank,
    memory_rows,
)

MIB = 1 << 20


def _figure(rank, peak, categories=None):
    return RankMemory(
        rank=rank, measure="rss", steps=10, first_step=1, last_step=10, peak_bytes=peak,
        peak_step=5, reserved_bytes=math.nan, device_total_bytes=math.nan,
        headroom_pct=math.nan, growth_bytes_per_step=0.0, growth_from_step=None,
        noise_bytes=262144.0, steps_to_full=math.nan, full_at_step=None,
        categories_at_peak=categories, categories_steps=(7, 9) if categories else None,
        categories_peak_bytes=math.nan)


def test_the_median_rank_is_the_lower_middle_rank_by_peak():
    assert median_rank([_figure(0, 600 * MIB), _figure(1, 330 * MIB)]).rank == 1
    three = [_figure(0, 9 * MIB), _figure(1, 5 * MIB), _figure(2, 7 * MIB)]
    assert median_rank(three).rank == 2
    assert median_rank([]) is None


def test_rows_put_each_peak_against_the_median_ranks_in_rank_order():
    rows = memory_rows([_figure(1, 330 * MIB), _figure(0, 586 * MIB)])
    assert [r["rank"] for r in rows] == [0, 1]
    assert list(rows[0]) == MEMORY_COLUMNS
    assert rows[0]["peak_vs_median_bytes"] == 256 * MIB
    assert rows[0]["peak_vs_median_pct"] == 256 / 330 * 100
    assert (rows[1]["peak_vs_median_bytes"], rows[1]["median_rank"]) == (0, 1)
    assert rows[0]["headroom_pct"] is None and rows[0]["categories_at_peak"] is None


def test_category_differences_largest_first():
    high = _figure(0, 10, {"parameter": 4, "optimizer_state": 16, "activation": 3})
    low = _figure(1, 5, {"parameter": 4, "optimizer_state": 8, "activation": 5})
    differences = category_differences(high, low)
    assert differences[0] == ("optimizer_state", 8.0)
    assert differences[-1] == ("activation", -2.0)
    assert category_differences(high, _figure(1, 5)) == []
