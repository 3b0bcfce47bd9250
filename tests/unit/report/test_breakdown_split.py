"""The time-breakdown tables of the text report (analysis.report.breakdown_text): communication
shown as transfer and waiting for peers, never as one "comm"; communication the cross-rank
split does not cover shown apart, and said so (docs/definitions.md, "Waiting for peers")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.rank.step_breakdown import rank_totals
from analysis.report.breakdown_text import (
    UNSPLIT,
    breakdown_rows,
    breakdown_text,
    per_step_rows,
    per_step_text,
)

MS = 1e6


def _steps(transfer, waiting):
    """Rank 0, two 50 ms steps: 5 ms compute, 41.5 ms communication only, 3.5 ms idle."""
    return pd.DataFrame({
        "rank": [0, 0], "step": [1, 2], "kind": "cpu", "step_ns": [50 * MS] * 2,
        "compute_only_ns": [5 * MS] * 2, "comm_only_ns": [41.5 * MS] * 2,
        "overlap_ns": [0.0] * 2, "memcpy_ns": [0.0] * 2, "idle_ns": [3.5 * MS] * 2,
        "exposed_comm_ns": [41.5 * MS] * 2, "overlap_pct": [0.0] * 2,
        "transfer_ns": transfer, "peer_wait_ns": waiting})


def _totals(steps):
    return rank_totals(steps)


def test_a_straggled_rank_reads_as_transfer_and_waiting_not_comm():
    # 4 ms of transfer and 37.5 ms of waiting in each step: 8% and 75% of the step
    table, unsplit = breakdown_rows(_totals(_steps([4 * MS] * 2, [37.5 * MS] * 2)))
    row = table.iloc[0]
    assert (row["compute"], row["transfer"], row["waiting"], row["idle"]) == (
        "10.0%", "8.0%", "75.0%", "7.0%")
    assert "comm" not in table.columns and UNSPLIT not in table.columns and not unsplit
    assert list(table.columns[5:8]) == ["compute", "transfer", "waiting"]
    steps = per_step_text(_steps([4 * MS] * 2, [37.5 * MS] * 2))
    assert steps[["transfer", "waiting"]].values.tolist() == [["4.00", "37.50"]] * 2
    assert "comm" not in steps.columns


def test_communication_without_a_split_is_shown_apart():
    # step 2 has no cross-rank waits: its 41.5 ms stay unsplit
    steps = _steps([4 * MS, np.nan], [37.5 * MS, np.nan])
    table, unsplit = breakdown_rows(_totals(steps))
    row = table.iloc[0]
    assert unsplit and (row["transfer"], row["waiting"], row[UNSPLIT]) == (
        "4.0%", "37.5%", "41.5%")  # of the 100 ms of both steps
    shown, unsplit_steps = per_step_rows(steps)
    assert unsplit_steps
    assert shown[["transfer", "waiting", UNSPLIT]].values.tolist() == [
        ["4.00", "37.50", "0.00"], ["-", "-", "41.50"]]


def test_a_breakdown_without_the_split_shows_all_communication_unsplit():
    steps = _steps([np.nan] * 2, [np.nan] * 2).drop(columns=["transfer_ns", "peer_wait_ns"])
    table = breakdown_text(_totals(steps))
    assert (table.iloc[0]["transfer"], table.iloc[0]["waiting"], table.iloc[0][UNSPLIT]) == (
        "-", "-", "83.0%")
