"""A run comparison (analysis.diff.compare.compare) as text, the JSON document, CSV or a
self-contained HTML page (docs/diff.md). Strings only; analysis.diff prints them."""

from __future__ import annotations

import io
import math

import pandas as pd

from analysis.core.step_spec import PathWindow
from analysis.report.html import html_table
from analysis.report.html.assets import SCRIPT, STYLE
from analysis.report.html.charts import esc
from analysis.report.values import plain, records

DOCUMENT_VERSION = 1
TEXT_WIDTH = 100
CHANGE_KEYS = ["median_a_ms", "median_b_ms", "change_pct", "ci_low_pct", "ci_high_pct",
               "excludes_zero", "noise_floor_pct", "noise_floor_source", "significant",
               "confidence", "seed", "resamples", "block_steps", "steps_a", "steps_b",
               "runs_a", "runs_b"]
# (section, heading, the role/item columns, units of a/b/delta)
LONG_SECTIONS = [("categories", "Where each step's time goes, mean ms per step", "category"),
                 ("critical_path", "The critical path by rank and category, mean ms per "
                                   "analysed step", "category"),
                 ("resources", "Memory peaks and device-sample averages", "metric"),
                 ("pipeline", "Pipeline bubbles, % of step time", "metric")]
# The sections whose values are ms per step (their CSV metric "ms", JSON keys a_ms, ...)
MS_SECTIONS = ("categories", "critical_path")


def document(result: dict, a, b, steps_spec: str | None, window: PathWindow | None = None) -> dict:
    """The JSON document (docs/diff.md#the-json-document)."""
    def side(s) -> dict:
        return {"path": s.path, "runs": [r.name for r in s.runs]}

    layout = result["layout"]
    return {
        "schema_version": DOCUMENT_VERSION,
        "a": {**side(a), "layout": plain(layout["a"])},
        "b": {**side(b), "layout": plain(layout["b"])},
        "selection": {"steps": steps_spec or "all",
                      "window": getattr(window, "name", None),
                      "instance": getattr(window, "instance", None)},
        "verdict": {"text": result["verdict"], "coverage": result["coverage"],
                    **{k: plain(result["change"][k]) for k in CHANGE_KEYS}},
        "layout_note": layout["note"],
        "categories": records(_renamed(result["categories"], "_ms")),
        "critical_path": records(_renamed(result["critical_path"], "_ms")),
        "critical_path_line": result["critical_path_line"],
        "phases": {"a": plain(result.get("phases", {}).get("a", [])),
                   "b": plain(result.get("phases", {}).get("b", [])),
                   "line": result.get("phases_line")},
        "operators": records(result["operators"]),
        "collectives": records(result["collectives"]),
        "resources": records(result["resources"]),
        "findings": records(result["findings"]),
        "pipeline": records(result["pipeline"]),
        "problems": list(result["problems"]),
    }


def _renamed(frame: pd.DataFrame, unit: str) -> pd.DataFrame:
    return frame.rename(columns={"a": f"a{unit}", "b": f"b{unit}", "delta": f"delta{unit}"})


def csv_text(result: dict) -> str:
    """One long table: section, role, item, metric, a, b, delta."""
    rows = [{"section": "verdict", "role": "", "item": "median step", "metric": "ms",
             "a": result["change"]["median_a_ms"], "b": result["change"]["median_b_ms"],
             "delta": _difference(result["change"]["median_a_ms"],
                                  result["change"]["median_b_ms"])}]
    for section, _, item in LONG_SECTIONS:
        for row in result[section].to_dict("records"):
            rows.append({"section": section, "role": row["role"], "item": row[item],
                         "metric": "ms" if section in MS_SECTIONS else row[item], "a": row["a"],
                         "b": row["b"], "delta": row["delta"]})
    for row in result["operators"].to_dict("records"):
        for metric in ("calls", "self_ms", "total_ms"):
            rows.append({"section": row["kind"], "role": "", "item": row["key"],
                         "metric": metric, "a": row[f"{metric}_a"], "b": row[f"{metric}_b"],
                         "delta": row[f"{metric}_delta"]})
    for row in result["collectives"].to_dict("records"):
        for metric in ("count", "bytes", "busbw_gbps"):
            rows.append({"section": "collectives", "role": "",
                         "item": f"{row['op']} {row['size_bucket']}", "metric": metric,
                         "a": row[f"{metric}_a"], "b": row[f"{metric}_b"],
                         "delta": row[f"{metric}_delta"]})
    for row in result["findings"].to_dict("records"):
        rows.append({"section": "findings", "role": row["status"], "item": row["finding"],
                     "metric": "share_pct", "a": row["share_pct_a"], "b": row["share_pct_b"],
                     "delta": row["share_pct_delta"]})
    buffer = io.StringIO()
    pd.DataFrame(rows, columns=["section", "role", "item", "metric", "a", "b", "delta"]).to_csv(
        buffer, index=False)
    return buffer.getvalue()


def _difference(a, b):
    return None if a is None or b is None else b - a


# ---- text ----------------------------------------------------------------------------------------
def _number(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and abs(value) >= 1e6:
        return f"{value:.4g}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _short(text: str, width: int = TEXT_WIDTH) -> str:
    """Long kernel names and call stacks keep their start and end in a terminal table."""
    if len(text) <= width:
        return text
    return text[:width * 2 // 3] + "\u2026" + text[-(width - width * 2 // 3 - 1):]


def _text_table(frame: pd.DataFrame, columns: dict) -> str:
    """`columns` {column: heading}; numbers with two decimals, `-` where missing."""
    if frame is None or frame.empty:
        return "  (none)\n"
    shown = pd.DataFrame({heading: [_number(v) if not isinstance(v, str) else _short(v)
                                    for v in frame[column]]
                          for column, heading in columns.items() if column in frame.columns})
    return shown.to_string(index=False) + "\n"


def text_report(result: dict, a, b) -> str:
    lines = [f"A: {a.path} ({_runs_text(a)})", f"B: {b.path} ({_runs_text(b)})", "",
             f"Verdict: {result['verdict']}", f"  ({result['coverage']})"]
    if result["layout"]["note"]:
        lines.append(f"Ranks: {result['layout']['note']}")
    if result.get("critical_path_line"):
        lines.append(f"Critical path: {result['critical_path_line']}")
    if result.get("phases_line"):
        lines.append(f"Phases: {result['phases_line']}")
    out = "\n".join(lines) + "\n"
    long_columns = {"role": "role", "a": "A", "b": "B", "delta": "B - A"}
    for section, heading, item in LONG_SECTIONS:
        out += f"\n{heading}\n" + _text_table(result[section], {
            "role": "role", item: item, **{k: v for k, v in long_columns.items() if k != "role"}})
    operators = result["operators"]
    for kind, heading in (("op", "Operators"), ("kernel", "Kernels")):
        frame = operators[operators["kind"] == kind]
        out += (f"\n{heading}: largest changes of self time, per rank and step\n"
                + _text_table(frame, {"key": "name (@ call stack where the name repeats)",
                                      "calls_a": "calls A", "calls_b": "calls B",
                                      "self_ms_a": "self ms A", "self_ms_b": "self ms B",
                                      "self_ms_delta": "B - A"}))
    out += "\nCollectives per rank and step\n" + _text_table(result["collectives"], {
        "op": "op", "size_bucket": "size", "count_a": "count A", "count_b": "count B",
        "bytes_a": "bytes A", "bytes_b": "bytes B", "busbw_gbps_a": "busbw A GB/s",
        "busbw_gbps_b": "busbw B GB/s"})
    out += "\nFindings\n" + _text_table(result["findings"], {
        "status": "status", "finding": "finding", "share_pct_a": "share % A",
        "share_pct_b": "share % B", "ranks_a": "ranks A", "ranks_b": "ranks B"})
    return out


def _runs_text(side) -> str:
    names = [r.name for r in side.runs]
    return names[0] if len(names) == 1 else f"{len(names)} runs: {', '.join(names)}"


# ---- HTML ----------------------------------------------------------------------------------------
def _html_table(frame: pd.DataFrame, columns: dict) -> str:
    """`columns` {column: heading}, numbers as the text report writes them."""
    return html_table(frame, {column: (heading, _number) for column, heading in columns.items()})


def html_page(result: dict, a, b) -> str:
    """One self-contained page (inline style and script, no network); every name escaped."""
    parts = [f"<p>A: {esc(a.path)} ({esc(_runs_text(a))})<br>B: {esc(b.path)} "
             f"({esc(_runs_text(b))})</p>",
             f"<h2>Verdict</h2><p><strong>{esc(result['verdict'])}</strong></p>"
             f"<p>{esc(result['coverage'])}</p>"]
    if result["layout"]["note"]:
        parts.append(f"<p>{esc(result['layout']['note'])}</p>")
    if result.get("critical_path_line"):
        parts.append(f"<p>Critical path: {esc(result['critical_path_line'])}</p>")
    if result.get("phases_line"):
        parts.append(f"<p>Phases: {esc(result['phases_line'])}</p>")
    long_columns = {"a": "A", "b": "B", "delta": "B \u2212 A"}
    for section, heading, item in LONG_SECTIONS:
        parts.append(f"<h2>{esc(heading)}</h2>" + _html_table(
            result[section], {"role": "role", item: item, **long_columns}))
    parts.append("<h2>Operators and kernels, per rank and step</h2>" + _html_table(
        result["operators"], {"kind": "kind", "key": "name (@ call stack)", "calls_a": "calls A",
                              "calls_b": "calls B", "self_ms_a": "self ms A",
                              "self_ms_b": "self ms B", "self_ms_delta": "B \u2212 A"}))
    parts.append("<h2>Collectives per rank and step</h2>" + _html_table(
        result["collectives"], {"op": "op", "size_bucket": "size", "count_a": "count A",
                                "count_b": "count B", "bytes_a": "bytes A", "bytes_b": "bytes B",
                                "busbw_gbps_a": "busbw A GB/s", "busbw_gbps_b": "busbw B GB/s"}))
    parts.append("<h2>Findings</h2>" + _html_table(
        result["findings"], {"status": "status", "finding": "finding",
                             "share_pct_a": "share % A", "share_pct_b": "share % B",
                             "evidence_b": "evidence in B"}))
    if result["problems"]:
        items = "".join(f"<li>{esc(p)}</li>" for p in result["problems"])
        parts.append(f"<h2>Problems</h2><ul>{items}</ul>")
    title = f"ranktrace diff: {a.path} vs {b.path}"
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{esc(title)}</h1><pre id=\"js-errors\"></pre>" + "".join(parts)
            + f"<script>{SCRIPT}</script></body></html>")
