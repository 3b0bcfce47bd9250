"""The collectives table (analysis.rank.comm.comm_ops.collectives_table): ops grouped by op, issuer,
group and size bucket, their sums, counts, distinct ranks and steps, the slowest rank and the
rows' order, against answers worked out by hand on small frames."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.rank.comm.comm_ops import COLLECTIVES_COLUMNS, OPS_COLUMNS, collectives_table
from tracer import schema


def ops_frame(rows) -> pd.DataFrame:
    base = {"source": None, "dtype": "float32", "origin": "trace", "algbw_gbps": np.nan,
            "busbw_gbps": np.nan, "issuer": "c10d", "pg": "0", "pg_size": 2, "step": 1,
            "rank": 0, "pg_desc": None, "op": "all_reduce"}
    return pd.DataFrame([{**base, **row} for row in rows], columns=OPS_COLUMNS)


def test_ties_in_total_time_are_ordered_by_op_group_issuer_and_bucket_then_first_seen():
    ops = ops_frame([
        {"op": "b", "bytes": 8.0, "duration_us": 1.0},
        {"op": "a", "pg": "1", "bytes": 8.0, "duration_us": 1.0},
        {"op": "a", "pg": "0", "issuer": "ddp", "bytes": 8.0, "duration_us": 1.0},
        {"op": "a", "pg": "0", "bytes": 100.0, "duration_us": 1.0},
        {"op": "a", "pg": "0", "bytes": 8.0, "duration_us": 1.0},
        {"op": "a", "pg": "0", "pg_size": 4, "bytes": 8.0, "duration_us": 1.0},  # a full tie
        {"op": "z", "bytes": 8.0, "duration_us": np.nan},  # no time: last
        {"op": "y", "bytes": 8.0, "duration_us": 5.0},
    ])
    table = collectives_table(ops)
    assert list(table.columns) == COLLECTIVES_COLUMNS
    assert table.index.equals(pd.RangeIndex(8))
    assert list(zip(table["op"], table["pg"], table["issuer"], table["size_bucket"],
                    table["pg_size"])) == [
        ("y", "0", "c10d", "8-16 B", 2),
        ("a", "0", "c10d", "8-16 B", 2), ("a", "0", "c10d", "8-16 B", 4),
        ("a", "0", "c10d", "64-128 B", 2), ("a", "0", "ddp", "8-16 B", 2),
        ("a", "1", "c10d", "8-16 B", 2), ("b", "0", "c10d", "8-16 B", 2),
        ("z", "0", "c10d", "8-16 B", 2)]
    assert math.isnan(table["total_us"].iloc[-1]) and math.isnan(table["mean_us"].iloc[-1])


def test_counts_sums_and_distinct_ranks_and_steps_skip_missing_values():
    ops = ops_frame([
        {"rank": 0, "step": 1, "bytes": 1000.0, "duration_us": 10.0},
        {"rank": 0, "step": 1, "bytes": 1000.0, "duration_us": np.nan},
        {"rank": 1, "step": None, "bytes": 1000.0, "duration_us": np.nan},
        {"rank": None, "step": 2, "bytes": 1000.0, "duration_us": 0.0},
        {"rank": 1, "step": 2, "bytes": 1000.0, "duration_us": 20.0},
    ])
    table = collectives_table(ops)
    assert len(table) == 1
    row = table.iloc[0]
    assert row["count"] == 5
    assert row["total_bytes"] == 5000.0
    assert row["total_us"] == 30.0 and row["mean_us"] == 10.0  # 3 timed ops, one of 0 us
    assert (row["ranks"], row["rank_steps"]) == (2, 2)  # (0, 1) and (1, 2)
    # Bandwidth over the ops with size and a time above 0: 2000 B in 30 us.
    assert row["algbw_gbps"] == schema.bandwidth_gbps("all_reduce", 2000, 1, 30.0 / 1e6)[0]
    # Rank 0: 1000 B in 10 us, rank 1: 1000 B in 20 us: rank 1 is slower.
    assert row["slowest_rank"] == 1
    assert row["slowest_rank_busbw_gbps"] == 1000 / (20.0 / 1e6) / 1e9


def test_missing_issuer_and_description_columns_leave_unknown_issuers_and_bare_ids():
    ops = ops_frame([{"pg": "5", "bytes": 8.0, "duration_us": 1.0}]).drop(
        columns=["issuer", "pg_desc"])
    table = collectives_table(ops)
    assert (table["issuer"].tolist(), table["pg"].tolist(), table["pg_id"].tolist()) == (
        ["unknown"], ["5"], ["5"])


def test_a_group_named_on_one_rank_is_named_on_all_by_its_first_name():
    ops = ops_frame([
        {"rank": 0, "pg": "1", "pg_desc": None, "bytes": 8.0, "duration_us": 1.0},
        {"rank": 1, "pg": "1", "pg_desc": "mesh_dp", "bytes": 8.0, "duration_us": 1.0},
        {"rank": 2, "pg": "1", "pg_desc": "other", "bytes": 8.0, "duration_us": 1.0},
        {"rank": 0, "pg": None, "pg_desc": None, "bytes": 8.0, "duration_us": 1.0},
    ])
    table = collectives_table(ops)
    assert table["pg"].tolist() == ["mesh_dp (1)", "unknown"]


@pytest.mark.parametrize("rank_order", [[0] * 10 + [1] * 10, [1] * 10 + [0] * 10,
                                        [0, 1] * 10])
def test_each_groups_per_rank_sums_are_its_own_groupby_sums(rank_order):
    """Two groups, one whose rows come in rank order and one whose rows do not: pandas sums a
    group's ranks by ufunc.reduceat in the first case and with compensated sums in the second,
    which differ in the last bit for ten 0.3 us ops; each group gets its own groupby's sums."""
    rows = [{"rank": r, "op": "all_reduce", "bytes": 1024.0, "duration_us": (0.1, 0.3)[r]}
            for r in rank_order]
    rows += [{"rank": r, "op": "all_gather", "bytes": 1024.0, "duration_us": (0.1, 0.3)[r]}
             for r in sorted(rank_order, reverse=True)]
    ops = ops_frame(rows)
    table = collectives_table(ops).set_index("op")
    for op, group in ops.groupby("op"):
        per_rank = group.groupby("rank")[["bytes", "duration_us"]].sum()
        slowest = per_rank["duration_us"].idxmax()
        expected = schema.bandwidth_gbps(op, int(round(per_rank.loc[slowest, "bytes"])), 2,
                                         per_rank.loc[slowest, "duration_us"] / 1e6)[1]
        assert table.loc[op, "slowest_rank"] == slowest
        assert table.loc[op, "slowest_rank_busbw_gbps"] == expected  # exactly
