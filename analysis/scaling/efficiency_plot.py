"""The scaling study's plot as one inline SVG: parallel efficiency against world size above, and
below it a stacked bar per world size of where the mean step's time goes (docs/scaling.md).

Built with analysis.report.html.charts's line plot and stacked bars, so it matches the HTML
report and escapes every text it shows.
"""

from __future__ import annotations

import re

import pandas as pd

from analysis.report.html import charts as svg

# Bar parts: the scaling table's columns and the HTML palette's names for them.
BAR_PARTS = {"compute_ms": "compute", "copies_ms": "memcpy", "transfer_ms": "transfer",
             "waiting_ms": "waiting", "idle_ms": "idle"}
WIDTH = 760
_SIZE = re.compile(r'^<svg class="chart" viewBox="0 0 (\d+) (\d+)"')


def _height(chart: str) -> int:
    match = _SIZE.match(chart)
    return int(match.group(2)) if match else 0


WARNING_ROW = 18


def scaling_svg(table: pd.DataFrame, warnings: list[str] | tuple = ()) -> str:
    """`table`: `scaling_table.scaling_table`'s rows; `warnings` (table.warnings) are drawn as
    lines above the plot. Returns one <svg> element."""
    labels = [f"{int(w)} ranks" + (f", {int(n)} nodes" if n > 1 else "")
              for w, n in zip(table["world_size"], table["nnodes"])]
    efficiency = svg.lines([("efficiency %", [float(w) for w in table["world_size"]],
                             [float(e) for e in table["efficiency_pct"]])],
                           "world size (ranks)", "parallel efficiency %", width=WIDTH)
    if not efficiency.startswith("<svg"):  # no efficiency to draw: the bars alone
        efficiency = ""
    parts = table[list(BAR_PARTS)].fillna(0.0)
    bars = svg.stacked_bars(labels, list(BAR_PARTS.values()),
                            parts.to_numpy(dtype="float64").tolist(), "ms per step", width=WIDTH)
    top, bottom = _height(efficiency), _height(bars)
    shift = WARNING_ROW * len(warnings)
    height = shift + top + bottom + 10
    notes = "".join(f'<text class="warning" x="4" y="{WARNING_ROW * (i + 1) - 5}" fill="#b00">'
                    f'warning: {svg.esc(w)}</text>' for i, w in enumerate(warnings))
    return (f'<svg class="chart scaling" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" role="img" xmlns="http://www.w3.org/2000/svg">'
            f'<title>{svg.esc("parallel efficiency and step time parts per world size")}</title>'
            f'{notes}<svg y="{shift}" width="{WIDTH}" height="{top}">{efficiency}</svg>'
            f'<svg y="{shift + top + 10}" width="{WIDTH}" height="{bottom}">{bars}</svg></svg>')


def scaling_page(title: str, table: pd.DataFrame, report_text: str,
                 warnings: list[str] | tuple = ()) -> str:
    """One self-contained HTML page (inline style and script, no network): the warnings, the
    plot, then the text report, every name escaped; the HTML report's own style and script."""
    from analysis.report.html.assets import SCRIPT, STYLE

    listed = "".join(f"<li>{svg.esc(w)}</li>" for w in warnings)
    listed = f'<ul class="warnings">{listed}</ul>' if listed else ""

    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{svg.esc(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{svg.esc(title)}</h1><pre id=\"js-errors\"></pre>"
            f"{listed}<section id=\"scaling\"><h2>Efficiency and where the step time goes</h2>"
            f"{scaling_svg(table)}</section>"
            f"<section id=\"report\"><h2>Report</h2><pre>{svg.esc(report_text)}</pre></section>"
            f"<script>{SCRIPT}</script></body></html>")
