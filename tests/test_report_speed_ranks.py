"""analysis.rank.tables' shortcuts for breakdown_per_step's own frames and runs without tracer
records: the same tables as the general path, checked against hand-computed answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.ingest.load import RankTrace
from analysis.rank.resources import rank_resources as _rank_resources
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS
from analysis.rank.tables import _clean_per_step, per_rank_table, per_step_table

MS = 1_000_000


def breakdown(rank, steps, step_ms, compute_ms) -> pd.DataFrame:
    """breakdown_per_step's frame (int64 times, str kind) for one rank."""
    n = len(steps)
    columns = {"rank": rank, "step": np.array(steps, dtype=np.int64),
               "step_ns": np.array(step_ms, dtype=np.int64) * MS,
               "compute_only_ns": np.array(compute_ms, dtype=np.int64) * MS}
    for name in BREAKDOWN_NS_COLUMNS[2:]:
        columns[name] = np.zeros(n, dtype=np.int64)
    columns["idle_ns"] = columns["step_ns"] - columns["compute_only_ns"]
    columns.update(overlap_pct=np.full(n, np.nan), kind="gpu",
                   start_ns=np.arange(n, dtype=np.int64), end_ns=np.arange(n, dtype=np.int64) + 1)
    return pd.DataFrame(columns)


def trace(rank) -> RankTrace:
    return RankTrace(rank=rank, world_size=2, path=Path(f"rank{rank}.1.pt.trace.json.gz"),
                     events=pd.DataFrame(), steps=pd.DataFrame(), records=None, problems=[])


def two_ranks() -> pd.DataFrame:
    return pd.concat([breakdown(0, [1, 2], [10, 30], [4, 6]),
                      breakdown(1, [1, 2], [20, 40], [8, 2])], ignore_index=True)


def test_clean_breakdown_frame_is_typed_like_the_general_path():
    frame = two_ranks()
    clean = _clean_per_step(frame)
    assert list(clean.columns[:11]) == ["rank", "step", *BREAKDOWN_NS_COLUMNS, "overlap_pct",
                                        "kind"]
    assert list(clean.columns[11:]) == ["start_ns", "end_ns"]
    assert str(clean["rank"].dtype) == "Int64" and str(clean["step"].dtype) == "Int64"
    assert clean["step_ns"].dtype == np.float64 and clean["start_ns"].dtype == np.int64
    assert clean["step_ns"].tolist() == [10e6, 30e6, 20e6, 40e6]
    assert clean["idle_ns"].tolist() == [6e6, 24e6, 12e6, 38e6]
    assert isinstance(clean.index, pd.RangeIndex)
    # The input is left as it was, and the result does not share its memory.
    clean.loc[0, "step_ns"] = -1.0
    assert frame["step_ns"].iloc[0] == 10 * MS
    # A rank without a number takes the general path; the other rows read the same.
    general = frame.astype({"rank": object})
    general.loc[3, "rank"] = None
    cleaned = _clean_per_step(general)
    assert cleaned["rank"].isna().tolist() == [False, False, False, True]
    pd.testing.assert_frame_equal(cleaned.iloc[:3], clean.iloc[:3].assign(step_ns=[10e6, 30e6,
                                                                                   20e6]),
                                  check_exact=True)


def test_without_records_rank_resources_are_an_empty_typed_frame():
    resources = _rank_resources([trace(0), trace(1)])
    assert resources.empty and isinstance(resources.index, pd.RangeIndex)
    assert str(resources["rank"].dtype) == "Int64"
    assert all(resources[c].dtype == np.float64 for c in resources.columns[1:])


def test_tables_of_a_run_without_records_by_hand():
    traces = [trace(0), trace(1)]
    per_rank = per_rank_table(two_ranks(), traces)
    assert per_rank["rank"].tolist() == [0, 1]
    assert per_rank["mean_step_ns"].tolist() == [20e6, 30e6]
    assert per_rank["compute_only_ns"].tolist() == [5e6, 5e6]
    assert per_rank["idle_pct"].tolist() == [30 / 40 * 100, 50 / 60 * 100]
    assert per_rank["slowdown_vs_fastest_pct"].tolist() == [0.0, 50.0]
    assert per_rank["slowest"].tolist() == [False, True]
    assert per_rank["peak_rss_bytes"].isna().all() and per_rank["steps"].tolist() == [2, 2]
    per_step = per_step_table(two_ranks(), traces)
    assert per_step[["step", "rank"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
    assert per_step["ranks_mean_step_ns"].tolist() == [15e6, 15e6, 35e6, 35e6]
    assert per_step["slowest_rank"].tolist() == [1, 1, 1, 1]
    assert per_step["imbalance_pct"].tolist() == [5 / 15 * 100] * 2 + [5 / 35 * 100] * 2
    assert per_step["peak_allocated_bytes"].isna().all()
    assert per_step["util_samples"].isna().all() and str(per_step["util_samples"].dtype) == "Int64"
