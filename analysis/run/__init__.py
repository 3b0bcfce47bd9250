"""Analysing a run: the one load with the per-rank reduction, every table of the run, and
`Run` / `open_run`, the front for notebooks (docs/analysis.md)."""

from analysis.run.analysed_run import Run, open_run

__all__ = ["Run", "open_run"]
