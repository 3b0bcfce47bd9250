"""The CSV files of `--out DIR`: every table of an analysed run, one file each, as it is."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.core.contracts import RunReport
from analysis.crossrank import report_tables as cross_report
from analysis.report.memory_output import memory_table

WHAT_IF_COLUMNS = ["change", "kind", "ranks", "saved_ms_per_step", "predicted_step_ms",
                   "assumptions"]


def csv_tables(report: RunReport) -> dict[str, pd.DataFrame]:
    """File stem -> table written by --out."""
    tables = {
        "per_step": report.step_table(),
        "rank_totals": report.totals,
        "hta_compatible": report.hta,
        "idle": report.idle,
        "idle_gaps": report.idle_gaps,
    }
    for stem, table in (("per_rank", report.per_rank), ("comm_ops", report.comm_ops),
                        ("collectives", report.collectives),
                        ("setup_collectives", report.setup_collectives),
                        ("bottlenecks", report.findings), ("notes", report.notes),
                        ("mfu", report.mfu), ("roofline", report.roofline)):
        if table is not None:
            tables[stem] = table
    if report.critical is not None:
        tables["critical_path"] = report.critical.critical_path
        tables["critical_path_steps"] = report.critical.critical_path_steps
        tables["what_if"] = pd.DataFrame(report.critical.what_if, columns=WHAT_IF_COLUMNS)
    if report.cross_rank is not None:
        tables.update(cross_report.csv_tables(report.cross_rank))
    if report.memory is not None and report.memory.rows:
        tables["memory"] = memory_table(report.memory)
    return tables


def write_csvs(report: RunReport, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, table in csv_tables(report).items():
        path = out_dir / f"{stem}.csv"
        table.to_csv(path, index=False)
        written.append(path)
    return written
