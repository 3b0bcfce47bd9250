"""One rank to tables: the time breakdown per step, idle gaps, HTA's columns, the per-rank and
per-step tables, and the rank's communication ops (analysis.rank.comm)."""
