"""analysis.rank.tables' array paths for runs without tracer records (no merges with the empty
resources): per-step spread, order and missing resources, and per-rank rows, checked against
hand-computed answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.ingest.load import RankTrace
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS
from analysis.rank.tables import PER_RANK_COLUMNS, PER_STEP_COLUMNS, per_rank_table, per_step_table


def trace(rank) -> RankTrace:
    return RankTrace(rank=rank, world_size=3, path=Path(f"rank{rank}.1.pt.trace.json.gz"),
                     events=pd.DataFrame(), steps=pd.DataFrame(), records=None, problems=[])


def rows() -> pd.DataFrame:
    """Rows out of (step, rank) order; step 7 has one rank, step 3 two, with a NaN memcpy."""
    frame = pd.DataFrame({"rank": [1, 0, 0, 1], "step": [3, 7, 3, 9]})
    for column in BREAKDOWN_NS_COLUMNS:
        frame[column] = np.zeros(4)
    frame["step_ns"] = [30.0, 10.0, 20.0, np.nan]
    frame["compute_only_ns"] = [5.0, 1.0, 2.0, np.nan]
    frame["overlap_ns"] = [1.0, 1.0, 1.0, np.nan]
    frame["memcpy_ns"] = [np.nan, 1.0, 0.0, np.nan]
    frame["overlap_pct"] = np.nan
    frame["kind"] = ["gpu", "gpu", "gpu", "cpu"]
    frame["start_ns"] = np.arange(4)
    return frame


def test_per_step_spread_order_and_missing_resources():
    table = per_step_table(rows(), [trace(0), trace(1)])
    assert list(table.columns) == [*PER_STEP_COLUMNS, "start_ns"]
    assert table["step"].tolist() == [3, 3, 7, 9]
    assert table["rank"].tolist() == [0, 1, 0, 1]
    assert table["start_ns"].tolist() == [2, 0, 1, 3]
    assert table["work_ns"].tolist()[:3] == [3.0, 6.0, 3.0]  # NaN memcpy counts as 0
    assert np.isnan(table["work_ns"].iloc[3])  # all three parts missing
    assert table["ranks_max_step_ns"].tolist()[:3] == [30.0, 30.0, 10.0]
    assert table["ranks_min_step_ns"].tolist()[:3] == [20.0, 20.0, 10.0]
    assert table["ranks_mean_step_ns"].tolist()[:3] == [25.0, 25.0, 10.0]
    assert table["imbalance_pct"].tolist()[:3] == [20.0, 20.0, 0.0]
    assert table["slowest_rank"].tolist()[:2] == [1, 1]
    assert table["slowest_rank"].isna().tolist() == [False, False, True, True]
    assert table[["ranks_max_step_ns", "imbalance_pct"]].iloc[3].isna().all()  # untimed step
    assert str(table["slowest_rank"].dtype) == "Int64"
    assert str(table["util_samples"].dtype) == "Int64" and table["util_samples"].isna().all()
    assert table["peak_allocated_bytes"].dtype == np.float64
    assert table["peak_allocated_bytes"].isna().all()
    assert isinstance(table.index, pd.RangeIndex)


def test_per_rank_rows_without_resources():
    table = per_rank_table(rows(), [trace(1), trace(0)])
    assert list(table.columns) == PER_RANK_COLUMNS
    assert table["rank"].tolist() == [0, 1]
    assert table["steps"].tolist() == [2, 2]
    assert table["mean_step_ns"].tolist() == [15.0, 30.0]
    assert table["work_ns"].tolist() == [3.0, 6.0]
    assert table["slowdown_vs_fastest_pct"].tolist() == [0.0, 100.0]
    assert table["slowest"].tolist() == [False, True]
    assert table["peak_reserved_pct"].isna().all() and table["peak_rss_bytes"].isna().all()
    assert table["kind"].tolist() == ["gpu", "cpu"]  # a tie: the smallest of the kinds


def test_listed_rank_without_steps_still_gets_its_row():
    table = per_rank_table(rows(), [trace(0), trace(1), trace(2)])
    assert table["rank"].tolist() == [0, 1, 2]
    assert table["steps"].tolist() == [2, 2, 0]
    assert np.isnan(table["mean_step_ns"].iloc[2])
