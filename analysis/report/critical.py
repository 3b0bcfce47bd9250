"""The critical path and what-if answers as the writers show them: text tables and the JSON
document's `critical_path` and `what_if` (docs/critical-path.md)."""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import CriticalPath
from analysis.core.step_spec import PathWindow
from analysis.report.text_tables import text_table as _table
from analysis.report.values import plain, records


def critical_path_steps_text(critical: CriticalPath) -> pd.DataFrame:
    """Per analysed step: the path's length, the ranks that end and start it, and its time by
    rank and category (ms)."""
    steps = critical.critical_path_steps
    if steps is None or steps.empty:
        return pd.DataFrame()
    path = critical.critical_path
    parts: dict = {}
    for row in records(path):
        parts.setdefault(row["step"], []).append(
            f"rank {row['rank']} {row['category']} {row['ms']:.2f}")
    return pd.DataFrame({
        "step": steps["step"].astype("int64"), "path ms": steps["path_ms"].round(2),
        "step ms": steps["step_ms"].round(2), "ends on": steps["end_rank"].astype("int64"),
        "starts on": steps["start_rank"].astype("int64"),
        "path time by rank and category (ms)": [", ".join(parts.get(int(s), []))
                                                for s in steps["step"]]})


def what_if_text(what_if: list) -> pd.DataFrame:
    return pd.DataFrame([{"change": w["change"], "saved ms/step": round(w["saved_ms_per_step"], 2),
                          "predicted step ms": round(w["predicted_step_ms"], 2)}
                         for w in what_if])


def critical_path_text(critical: CriticalPath, window: PathWindow | None = None) -> str:
    """The Critical path section: the path per analysed step (per occurrence of `window`'s
    annotation where given), then the what-if answers."""
    unit = ("step" if window is None else
            f"occurrence of {window.name!r} (step: its number, 0-based)")
    return "\n".join([
        _table(critical_path_steps_text(critical), f"Critical path per {unit} "
               "(docs/critical-path.md; waiting for peers is never on it)"),
        _table(what_if_text(critical.what_if), "What if (largest saving first)",
               "  saved ms/step: mean over the analysed steps; what the model ignores: "
               "docs/critical-path.md")])


def critical_path_json(critical: CriticalPath | None) -> dict:
    """The document's top-level `critical_path` (per analysed step: path_ms, step_ms, end_rank,
    start_rank and `by_rank`, the path's ms by rank and category) and `what_if` (largest saving
    first); null and [] where they could not be computed (docs/critical-path.md)."""
    if critical is None:
        return {"critical_path": None, "what_if": []}
    by_step: dict = {}
    for row in records(critical.critical_path):
        by_step.setdefault(row["step"], []).append(
            {"rank": row["rank"], "category": row["category"], "ms": row["ms"]})
    steps = [{**row, "by_rank": by_step.get(row["step"], [])}
             for row in records(critical.critical_path_steps)]
    return {"critical_path": steps, "what_if": [plain(w) for w in critical.what_if]}
