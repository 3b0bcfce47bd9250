"""The memory section as the writers show it (analysis.report.memory_output,
analysis.report.html.memory_figure): the JSON object, the CSV table with one column per
category, the terminal table with the out-of-memory lines, and the figure, escaped."""

from __future__ import annotations

import dataclasses

from analysis.core.contracts import Finding, MemorySection, OomDiagnosis
from analysis.report.html.memory_figure import FIGURE_MAX_RANKS, memory_figure
from analysis.report.memory_output import memory_json, memory_table, memory_text
from tracer import schema

MIB = 1 << 20


def _row(rank, peak, categories=None, median=1):
    return {"rank": rank, "measure": "rss", "steps": 3, "first_step": 1, "last_step": 3,
            "peak_bytes": peak, "peak_step": 2, "reserved_bytes": None,
            "device_total_bytes": None, "headroom_pct": None,
            "growth_bytes_per_step": 2.0 * MIB if rank == 1 else 0.0,
            "growth_from_step": 20 if rank == 1 else None, "steps_to_full": None,
            "full_at_step": None, "peak_vs_median_bytes": 0.0, "peak_vs_median_pct": 0.0,
            "median_rank": median, "categories_at_peak": categories,
            "categories_steps": [7, 9] if categories else None, "noise_bytes": 262144}


CATEGORIES = {**dict.fromkeys(schema.MEMORY_CATEGORIES, 0), "parameter": 789504}


def _section(**changes):
    section = MemorySection(
        rows=[_row(0, 586 * MIB, CATEGORIES), _row(1, 330 * MIB)],
        findings=(Finding("memory grows", float("nan"), "e", "s", "1", headline="h"),),
        series={0: ([1, 2, 3], [586.0 * MIB] * 3), 1: ([1, 2, 3], [330.0 * MIB] * 3)})
    return dataclasses.replace(section, **changes)


def test_json_holds_rows_findings_and_the_diagnosis():
    document = memory_json(_section())
    assert document["ranks"][0]["categories_at_peak"]["parameter"] == 789504
    assert document["findings"] == [{"finding": "memory grows", "evidence": "e",
                                     "suggestion": "s", "ranks": "1"}]
    assert document["oom"] is None and memory_json(None) is None


def test_csv_spreads_the_categories_over_columns():
    table = memory_table(_section())
    assert table.loc[0, "categories_at_peak.parameter"] == 789504
    assert table.loc[0, "categories_steps"] == "7-9"
    assert table["categories_at_peak.parameter"].isna().tolist() == [False, True]
    assert "categories_at_peak" not in table.columns


def test_text_shows_each_rank_its_categories_and_the_out_of_memory_lines():
    oom = OomDiagnosis(3, 41, [], ["Out of memory: rank 3 ran out first"])
    text = memory_text(_section(oom=oom))
    assert text.startswith("Memory (docs/memory.md)\n")
    assert "categories at the profiler's peak (MiB): rank 0 parameter 0.75" in text
    assert "   1     rss 330.0 MiB" in text and "2.00" in text  # rank 1's growth, MiB a step
    assert text.endswith("Out of memory\n  Out of memory: rank 3 ran out first\n")
    assert memory_text(MemorySection()) == ""


def test_the_figure_draws_one_line_per_rank_and_escapes_its_labels():
    page = memory_figure(_section(rows=[_row(0, 1, median=0) | {"measure": "<rss>"}]))
    assert page.count("<polyline") == 2 and "&lt;rss&gt;" in page and "<rss>" not in page
    many = {r: ([1, 2], [float(r), float(r)]) for r in range(40)}
    rows = [_row(r, float(r), median=7) for r in range(40)]
    page = memory_figure(_section(rows=rows, series=many))
    assert page.count("<polyline") == FIGURE_MAX_RANKS  # the 11 highest peaks and rank 7
    assert "rank 7 rss" in page and "rank 39 rss" in page and "rank 28 rss" not in page
