"""The HTML report's charts (analysis.report.html.charts) keep their texts apart: no tick label runs
into an axis title, a legend or another label. Checked on the SVG's own coordinates, with each
text's box estimated from its length (11 px text, 0.6 em a glyph), so the test needs no browser.
"""

from __future__ import annotations

import itertools
import re

import pytest

from analysis.report.html import charts as svg
from analysis.scaling.efficiency_plot import scaling_svg

GLYPH_PX, ASCENT_PX, DESCENT_PX = 0.6 * 11, 9, 3
TEXT = re.compile(r'<text(?P<attrs>[^>]*)>(?P<body>[^<]*)</text>')


def _attr(attrs: str, name: str, default=None):
    found = re.search(rf'\b{name}="([^"]*)"', attrs)
    return found.group(1) if found else default


def text_boxes(chart: str) -> list[tuple[str, float, float, float, float]]:
    """(text, x0, y0, x1, y1) of every <text> of a chart, from its x, y and text-anchor."""
    boxes = []
    for match in TEXT.finditer(chart):
        attrs, body = match.group("attrs"), match.group("body")
        x, y = float(_attr(attrs, "x", 0)), float(_attr(attrs, "y", 0))
        width = len(body) * GLYPH_PX
        anchor = _attr(attrs, "text-anchor", "start")
        x0 = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        boxes.append((body, x0, y - ASCENT_PX, x0 + width, y + DESCENT_PX))
    return boxes


def collisions(chart: str) -> list[tuple[str, str]]:
    found = []
    for a, b in itertools.combinations(text_boxes(chart), 2):
        if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]:
            found.append((a[0], b[0]))
    return found


def test_the_box_estimate_sees_a_collision():
    chart = ('<svg><text x="100" y="20" text-anchor="end">12.5</text>'
             '<text x="90" y="22">ms per step</text></svg>')
    assert collisions(chart) == [("12.5", "ms per step")]


@pytest.mark.parametrize("total", [1.0, 37.3, 999.0, 12345.0])
def test_stacked_bars_tick_labels_clear_the_axis_title(total):
    chart = svg.stacked_bars(["rank 0", "rank 1"], ["compute", "idle"],
                             [[total * 0.6, total * 0.4], [total * 0.5, total * 0.2]],
                             "ms per step (mean)")
    assert collisions(chart) == []
    ticks = [b for b in text_boxes(chart) if re.fullmatch(r"[\d.e+]+", b[0])]
    title = next(b for b in text_boxes(chart) if b[0] == "ms per step (mean)")
    assert ticks and all(t[4] <= title[2] for t in ticks)  # the title on a row of its own


@pytest.mark.parametrize("span", [0.9, 48.0, 1234.5])
def test_gantt_tick_labels_clear_the_axis_title(span):
    rows = [(f"rank {r}", [("compute", 0.0, span / 2, "c"), ("comm", span / 2, span, "m")])
            for r in range(3)]
    assert collisions(svg.gantt(rows, span, "ms from the rank's step start")) == []


def test_line_plots_keep_legend_axis_titles_and_ticks_apart():
    chart = svg.lines([("rank 0 cpu_process_pct", [0.0, 1.0, 2.5], [10.0, 95.0, 40.0]),
                       ("rank 1 cpu_process_pct", [0.0, 1.0, 2.5], [12.0, 80.0, 99.0])],
                      "s", "parallel efficiency %")
    assert collisions(chart) == []


def test_heat_map_labels_every_kth_column_where_labels_are_wider_than_cells():
    columns = [str(100 + i) for i in range(80)]  # 3-digit steps in 14 px cells
    chart = svg.heat_map(["rank 0"], columns, [[1.0] * 80], "ms")
    assert collisions(chart) == []
    labelled = [b[0] for b in text_boxes(chart) if b[0].isdigit()]
    assert labelled[:3] == ["100", "102", "104"] and len(labelled) == 40


def test_the_scaling_plot_has_no_colliding_texts():
    import pandas as pd
    table = pd.DataFrame({"world_size": [1, 2, 4], "nnodes": [1, 1, 1],
                          "efficiency_pct": [100.0, 310.0, 45.5],
                          "compute_ms": [10.0, 4.0, 3.0], "copies_ms": [0.0, 0.0, 0.0],
                          "transfer_ms": [0.0, 1.0, 2.0], "waiting_ms": [0.0, 0.5, 1.0],
                          "idle_ms": [1.0, 1.0, 1.0]})
    chart = scaling_svg(table)
    parts = re.findall(r'<svg y="\d+" width="\d+" height="\d+">(.*?)</svg></svg>', chart)
    # the efficiency plot above the stacked step-time bars, each with its axis titles
    expected = [{"world size (ranks)", "parallel efficiency %", "1", "2", "4"},
                {"ms per step", "1 ranks", "2 ranks", "4 ranks"}]
    assert len(parts) == len(expected)
    for part, labels in zip(parts, expected):
        assert labels <= {b[0] for b in text_boxes(part)}
        assert collisions(part) == []
