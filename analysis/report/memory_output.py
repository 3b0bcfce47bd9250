"""The memory section as the JSON, CSV and text writers show it (docs/memory.md): the JSON object,
the CSV table, the terminal table with the out-of-memory lines (the HTML figure is
analysis.report.html.memory_figure's). Everything here formats the MemorySection that
analysis.findings.memory_section computed.
"""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import MemorySection
from analysis.report.text_tables import text_table
from analysis.report.values import human_bytes, plain
from tracer import schema

CATEGORY_PREFIX = "categories_at_peak."


def memory_json(section: MemorySection | None) -> dict | None:
    """The document's `memory` object: {"ranks", "findings", "oom"}; None without a section."""
    if section is None:
        return None
    return {"ranks": plain(section.rows),
            "findings": [{"finding": f.name, "evidence": f.evidence, "suggestion": f.suggestion,
                          "ranks": f.ranks} for f in section.findings],
            "oom": plain(section.oom)}


def memory_table(section: MemorySection | None) -> pd.DataFrame:
    """The memory table for CSV: categories_at_peak spread over one column per category,
    categories_steps as "first-last"."""
    rows = []
    for row in (section.rows if section is not None else []):
        flat = {k: v for k, v in row.items() if k not in ("categories_at_peak",
                                                           "categories_steps")}
        categories = row.get("categories_at_peak") or {}
        for name in schema.MEMORY_CATEGORIES:
            flat[CATEGORY_PREFIX + name] = categories.get(name)
        steps = row.get("categories_steps")
        flat["categories_steps"] = f"{steps[0]}-{steps[1]}" if steps else None
        rows.append(flat)
    return pd.DataFrame(rows)


def _mib(value) -> str:
    return "-" if value is None else f"{value / (1 << 20):.2f}"


def memory_text(section: MemorySection | None) -> str:
    """The terminal's Memory section: a row per rank, its categories at the peak, and the
    out-of-memory diagnosis; "" without rows or diagnosis."""
    if section is None or (not section.rows and section.oom is None):
        return ""
    parts = []
    if section.rows:
        shown = pd.DataFrame([{
            "rank": r["rank"], "measure": r["measure"], "peak": human_bytes(r["peak_bytes"]),
            "at step": r["peak_step"], "reserved": human_bytes(r["reserved_bytes"]),
            "device": human_bytes(r["device_total_bytes"]),
            "headroom %": "-" if r["headroom_pct"] is None else f"{r['headroom_pct']:.1f}",
            "growth MiB/step": _mib(r["growth_bytes_per_step"]),
            "from step": r["growth_from_step"] if r["growth_from_step"] is not None else "-",
            "full at step": r["full_at_step"] if r["full_at_step"] is not None else "-",
            "vs median": human_bytes(r["peak_vs_median_bytes"])} for r in section.rows])
        categorized = [r for r in section.rows if r["categories_at_peak"]]
        note = "  categories at the profiler's peak (MiB): " + "; ".join(
            f"rank {r['rank']} " + ", ".join(
                f"{name} {_mib(size)}" for name, size in r["categories_at_peak"].items() if size)
            for r in categorized) if categorized else ""
        parts.append(text_table(shown, "Memory (docs/memory.md)", note))
    if section.oom is not None:
        parts.append("Out of memory\n" + "".join(f"  {line}\n" for line in section.oom.lines))
    return "\n".join(parts)
