"""Inline SVG charts: stacked bars, a heat map, a Gantt chart and line plots.

Plain SVG with a <title> tooltip per mark keeps an 8-rank report at a few hundred kB with no
script library (plotly's bundle alone is 4.5 MB). Every text from a trace goes through `esc`.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = {
    "compute": "#4c78a8", "overlap": "#72b7b2", "transfer": "#f58518", "waiting": "#e45756",
    "comm": "#f58518", "memcpy": "#b279a2", "idle": "#d4d4d4",
    "MFU": "#54a24b", "compute below roofline": "#9d755d",
}
SERIES = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
          "#ff9da6", "#9d755d", "#bab0ac"]


def esc(text) -> str:
    return escape(str(text), quote=True)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low] if math.isfinite(low) else [0.0]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


# Rows below a plot, in px: the tick labels' baseline, then the axis title's on a row of its own
# (the charts' text is 11 px: svg.chart's font-size), so that the two never overlap.
TICK_ROW = 16
TITLE_ROW = 15
CHAR_PX = 6.6  # the widest mean glyph width of 11 px sans-serif text (0.6 em), for spacing labels


def _num(value: float) -> str:
    return f"{value:.4g}"


def stacked_bars(rows: list[str], parts: list[str], values: list[list[float]], unit: str,
                 width: int = 760) -> str:
    """Horizontal bars, one per row, split into `parts` (values[row][part])."""
    bar, gap, left, top = 22, 8, 90, 28
    plot_bottom = top + len(rows) * (bar + gap)
    tick_y, title_y = plot_bottom + TICK_ROW, plot_bottom + TICK_ROW + TITLE_ROW
    height = title_y + 6
    total = max((sum(v) for v in values), default=0.0) or 1.0
    scale = (width - left - 20) / total
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img">']
    x = left
    for part in parts:  # legend
        out.append(f'<rect x="{x}" y="6" width="12" height="12" fill="{PALETTE[part]}"/>'
                   f'<text x="{x + 16}" y="16">{esc(part)}</text>')
        x += 30 + 8 * len(part)
    for i, (label, row) in enumerate(zip(rows, values)):
        y = top + i * (bar + gap)
        out.append(f'<text class="rowlabel" x="{left - 6}" y="{y + bar - 7}" '
                   f'text-anchor="end">{esc(label)}</text>')
        x = left
        for part, value in zip(parts, row):
            w = max(value, 0.0) * scale
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" '
                           f'fill="{PALETTE[part]}"><title>{esc(label)}: {esc(part)} '
                           f'{_num(value)} {esc(unit)}</title></rect>')
            x += w
    for tick in nice_ticks(0, total):
        tx = left + tick * scale
        out.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{top - 4}" y2="{plot_bottom}" '
                   f'class="grid"/><text x="{tx:.1f}" y="{tick_y}" '
                   f'text-anchor="middle">{_num(tick)}</text>')
    out.append(f'<text class="axis-title" x="{width - 10}" y="{title_y}" '
               f'text-anchor="end">{esc(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def heat_map(rows: list[str], columns: list[str], values: list[list[float]], unit: str) -> str:
    """Cells coloured from light (low) to dark (high); NaN cells stay blank."""
    cell_w, cell_h, left, top = max(14, min(48, 720 // max(len(columns), 1))), 22, 90, 24
    width = left + cell_w * len(columns) + 20
    height = top + cell_h * len(rows) + 10
    flat = [v for row in values for v in row if v == v]
    low, high = (min(flat), max(flat)) if flat else (0.0, 1.0)
    span = (high - low) or 1.0
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img">']
    # every k-th column labelled, so that labels wider than a cell do not run into each other
    widest = max((len(str(c)) for c in columns), default=1) * CHAR_PX + 4
    every = max(1, math.ceil(widest / cell_w))
    for j, column in enumerate(columns):
        if j % every:
            continue
        out.append(f'<text x="{left + j * cell_w + cell_w / 2:.1f}" y="{top - 8}" '
                   f'text-anchor="middle">{esc(column)}</text>')
    for i, (label, row) in enumerate(zip(rows, values)):
        y = top + i * cell_h
        out.append(f'<text class="rowlabel" x="{left - 6}" y="{y + cell_h - 7}" '
                   f'text-anchor="end">{esc(label)}</text>')
        for j, value in enumerate(row):
            if value != value:
                continue
            level = (value - low) / span
            shade = f"hsl(12, 80%, {92 - 52 * level:.0f}%)"
            out.append(f'<rect x="{left + j * cell_w}" y="{y}" width="{cell_w - 1}" '
                       f'height="{cell_h - 1}" fill="{shade}"><title>{esc(label)}, step '
                       f'{esc(columns[j])}: {_num(value)} {esc(unit)}</title></rect>')
    out.append("</svg>")
    return "".join(out)


def gantt(rows: list[tuple[str, list[tuple[str, float, float, str]]]], span: float, unit: str,
          width: int = 900) -> str:
    """One row per label, each holding (category, start, end, tooltip) bars; zoomed by script."""
    bar, left, top = 16, 130, 10
    plot_bottom = top + len(rows) * (bar + 6)
    tick_y, title_y = plot_bottom + TICK_ROW, plot_bottom + TICK_ROW + TITLE_ROW
    height = title_y + 6
    scale = (width - left - 20) / (span or 1.0)
    out = [f'<svg class="chart gantt" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" data-left="{left}" role="img"><g class="plot">']
    for i, (_, bars) in enumerate(rows):
        y = top + i * (bar + 6)
        for category, start, end, tip in bars:
            w = max((end - start) * scale, 0.3)
            # compute on the upper half, communication and copies on the lower: both show
            # where they overlap
            lower = category != "compute"
            out.append(f'<rect x="{left + start * scale:.2f}" y="{y + lower * bar / 2:.0f}" '
                       f'width="{w:.2f}" height="{bar / 2:.0f}" fill="{PALETTE[category]}">'
                       f'<title>{esc(tip)}</title></rect>')
    out.append("</g>")
    for i, (label, _) in enumerate(rows):
        y = top + i * (bar + 6)
        out.append(f'<text class="rowlabel" x="{left - 6}" y="{y + bar - 4}" '
                   f'text-anchor="end">{esc(label)}</text>')
    for tick in nice_ticks(0, span):
        tx = left + tick * scale
        out.append(f'<text x="{tx:.1f}" y="{tick_y}" text-anchor="middle">{_num(tick)}'
                   f'</text>')
    out.append(f'<text class="axis-title" x="{width - 10}" y="{title_y}" '
               f'text-anchor="end">{esc(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def lines(series: list[tuple[str, list[float], list[float]]], x_unit: str, y_unit: str,
          width: int = 760, height: int = 220,
          bands: list[tuple[float, float, str]] | None = None) -> str:
    """Line plot of (label, xs, ys) series: the legend on the first row, the y axis's title on
    the second, the plot, its x tick labels, and the x axis's title on a row of its own;
    `bands`: (x from, x to, tooltip) stretches shaded behind the lines in two alternating
    tints, a dashed line where each but the first begins (the phases of a run)."""
    left, right, bottom = 60, 20, TICK_ROW + TITLE_ROW + 6
    legend_y, y_title_y = 15, 15 + TITLE_ROW
    top = y_title_y + 12  # the top tick label (drawn 4 px below its line) clears the title
    xs = [x for _, sx, _ in series for x in sx]
    ys = [y for _, _, sy in series for y in sy if y == y]
    if not xs or not ys:
        return '<p class="none">no samples</p>'
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(0.0, min(ys)), max(ys) if max(ys) > 0 else 1.0
    sx = (width - left - right) / (x1 - x0)
    sy = (height - top - bottom) / ((y1 - y0) or 1.0)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img">']
    for tick in nice_ticks(y0, y1, 4):
        ty = height - bottom - (tick - y0) * sy
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" '
                   f'class="grid"/><text x="{left - 4}" y="{ty + 4:.1f}" '
                   f'text-anchor="end">{_num(tick)}</text>')
    plot_bottom = height - bottom
    for tick in nice_ticks(x0, x1):
        tx = left + (tick - x0) * sx
        out.append(f'<text x="{tx:.1f}" y="{plot_bottom + TICK_ROW}" '
                   f'text-anchor="middle">{_num(tick)}</text>')
    out.append(f'<text class="axis-title" x="{width - right}" '
               f'y="{plot_bottom + TICK_ROW + TITLE_ROW}" text-anchor="end">{esc(x_unit)}</text>'
               f'<text class="axis-title" x="4" y="{y_title_y}">{esc(y_unit)}</text>')
    for k, (start, end, tip) in enumerate(bands or []):
        bx0, bx1 = left + (start - x0) * sx, left + (end - x0) * sx
        out.append(f'<rect class="band" x="{bx0:.1f}" y="{top}" width="{max(bx1 - bx0, 0.5):.1f}" '
                   f'height="{plot_bottom - top}" fill="{"#eeeeee" if k % 2 else "#fbf3e4"}" '
                   f'fill-opacity="0.7">'
                   f'<title>{esc(tip)}</title></rect>')
        if k:
            out.append(f'<line x1="{bx0:.1f}" x2="{bx0:.1f}" y1="{top}" y2="{plot_bottom}" '
                       f'stroke="#888" stroke-dasharray="4 3"/>')
    for k, (label, px, py) in enumerate(series):
        colour = SERIES[k % len(SERIES)]
        points = " ".join(f"{left + (x - x0) * sx:.1f},{height - bottom - (y - y0) * sy:.1f}"
                          for x, y in zip(px, py) if y == y)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                   f'points="{points}"><title>{esc(label)}</title></polyline>')
        out.append(f'<rect x="{left + 10 + 150 * k}" y="{legend_y - 9}" width="10" '
                   f'height="10" fill="{colour}"/><text x="{left + 24 + 150 * k}" '
                   f'y="{legend_y}">{esc(label)}</text>')
    out.append("</svg>")
    return "".join(out)
