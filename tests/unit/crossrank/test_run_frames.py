"""The cross-rank ops of Kineto traces (analysis.crossrank.run_frames.ops_from_events), the step of
each op in its own rank's steps, and the functions of column values computed once per distinct
value (analysis.crossrank.distinct), against answers worked out by hand on small built frames."""

import numpy as np
import pandas as pd

from analysis.core.steps import step_at
from analysis.crossrank import distinct
from analysis.crossrank.run_frames import OP_COLUMNS, _steps_by_rank, ops_from_events


# ---- ops_from_events -----------------------------------------------------------------------------
def comm_frame() -> pd.DataFrame:
    """Kernels of two ranks, out of order: rank 1's two all-reduces of 1024 floats over 2, rank
    0's all-gather of 10 halves over 4 (group size missing: the world's), and a kernel of no
    known op."""
    frame = pd.DataFrame({
        "rank": [1, 0, 1, 0], "name": ["k", "k", "k", "ncclDevKernel_Weird"],
        "ts_ns": [500, 300, 100, 50], "end_ns": [600, 400, 200, 60], "stream": [7, 8, 7, 8],
        "is_gpu": True, "collective": ["allreduce", "all_gather", "all_reduce", None],
        "in_nelems": [1024.0, 10.0, 1024.0, np.nan], "out_nelems": np.nan,
        "comm_dtype": ["Float", "Half", "Float", None], "group_size": [2.0, np.nan, 2.0, 2.0],
        "pg_name": ["0", None, "0", "0"], "input_dims": None, "input_type": None})
    return frame.astype({"collective": object, "comm_dtype": object, "pg_name": object,
                         "input_dims": object, "input_type": object})


def steps_of() -> pd.DataFrame:
    return pd.DataFrame({"rank": [0, 1], "step": [3, 3], "start_ns": [0, 0],
                         "end_ns": [1000, 1000]})


def test_ops_from_events_are_sorted_typed_and_sized_as_worked_out_by_hand():
    ops = ops_from_events(comm_frame(), steps_of(), world_size=4)
    assert list(ops.columns) == OP_COLUMNS and isinstance(ops.index, pd.RangeIndex)
    assert ops["rank"].tolist() == [0, 1, 1] and ops["issue_ns"].tolist() == [300, 100, 500]
    assert ops["op"].tolist() == ["all_gather", "all_reduce", "all_reduce"]
    # all_gather: 10 x 2 B x 4 ranks; all_reduce: 1024 x 4 B
    assert ops["bytes"].tolist() == [80.0, 4096.0, 4096.0]
    assert ops["pg"].tolist() == ["unknown", "0", "0"] and ops["pg_size"].tolist() == [4, 2, 2]
    assert ops["queue"].tolist() == ["8", "7", "7"] and ops["step"].tolist() == [3, 3, 3]
    assert ops["dtype"].tolist() == ["float16", "float32", "float32"]
    assert {c: str(t) for c, t in ops.dtypes.items()} == {
        "rank": "int64", "pg": "object", "pg_size": "int64", "op": "object",
        "bytes": "float64", "dtype": "object", "step": "int64", "issue_ns": "int64",
        "end_ns": "int64", "peer": "float64", "queue": "object", "timed": "bool",
        "time_from": "object"}
    assert all(type(v) is str for c in ("pg", "op", "dtype", "queue") for v in ops[c])
    assert ops["peer"].isna().all()
    assert ops["time_from"].tolist() == ["trace"] * 3


def test_ops_outside_every_step_and_ranks_without_steps_are_left_out():
    steps = steps_of().assign(end_ns=[350, 1000])  # rank 0's all-gather at 300 is in step 3
    assert ops_from_events(comm_frame(), steps, 4)["issue_ns"].tolist() == [300, 100, 500]
    steps = steps_of().assign(end_ns=[250, 1000])
    assert ops_from_events(comm_frame(), steps, 4)["rank"].tolist() == [1, 1]
    ops = ops_from_events(comm_frame(), steps_of().iloc[:0], 4)
    assert ops.empty and list(ops.columns) == OP_COLUMNS


# ---- the step of each op -------------------------------------------------------------------------
STEPS = pd.DataFrame(
    # Rank 1's steps straddle rank 0's: at 120 ns rank 0 is in step 2, rank 1 in step 1.
    [(1, 2, 150, 260), (0, 2, 100, 200), (2, 7, 1000, 1100), (1, 1, 50, 150), (0, 1, 0, 100)],
    columns=["rank", "step", "start_ns", "end_ns"])
# (rank, time, step): a step holds [start, end); rank 3 has no steps.
TIMES = [
    (0, 50, 1.0), (1, 50, 1.0), (0, 120, 2.0), (1, 120, 1.0), (0, 150, 2.0), (1, 150, 2.0),
    (3, 60, np.nan), (0, 200, np.nan), (1, 40, np.nan), (2, 1000, 7.0), (2, 1100, np.nan),
    (1, 259, 2.0),
]


def test_each_op_is_in_its_own_rank_s_step():
    rank, times, expected = (np.array(column) for column in zip(*TIMES))
    found = _steps_by_rank(rank, times, STEPS)
    np.testing.assert_array_equal(found, expected)
    assert found.dtype == np.float64
    assert np.isnan(_steps_by_rank(rank, times, STEPS.iloc[:0])).all()
    assert _steps_by_rank(rank[:0], times[:0], STEPS).tolist() == []


def test_one_rank_s_steps_given_out_of_order():
    steps = STEPS[STEPS["rank"] == 1].assign(rank=3)
    times = np.array([49, 50, 149, 150, 259, 260], dtype=np.int64)
    found = _steps_by_rank(np.full(len(times), 3, dtype=np.int64), times, steps)
    np.testing.assert_array_equal(found, [np.nan, 1, 1, 2, 2, np.nan])


def test_step_at_outside_every_step_and_without_steps():
    starts, ends, numbers = np.array([0.0, 100.0]), np.array([50.0, 200.0]), np.array([3.0, 4.0])
    found = step_at(np.array([0.0, 49.0, 50.0, 100.0, 199.0, 200.0, np.nan, -1.0]), starts, ends,
                    numbers)
    np.testing.assert_array_equal(found, [3.0, 3.0, np.nan, 4.0, 4.0, np.nan, np.nan, np.nan])
    assert np.isnan(step_at(np.array([1.0, 2.0]), np.zeros(0), np.zeros(0), np.zeros(0))).all()


# ---- once per distinct value ---------------------------------------------------------------------
def test_by_value_calls_once_per_value_and_keeps_the_index():
    seen = []

    def upper(value):
        seen.append(value)
        return value.upper() if isinstance(value, str) else None

    column = pd.Series([None, "a", None, "b", "a"], index=[9, 8, 7, 6, 5], dtype=object)
    result = distinct.by_value(column, upper)
    assert result.tolist() == [None, "A", None, "B", "A"] and result.dtype == object
    assert result.index.tolist() == [9, 8, 7, 6, 5]
    assert sorted(map(str, seen)) == ["None", "a", "b"]
    assert distinct.by_value(pd.Series([], dtype=object), upper).tolist() == []


def test_by_value_passes_none_and_nan_as_the_column_holds_them_once_each():
    seen = []

    def kind(value):
        seen.append(value)
        return type(value).__name__

    mixed = pd.Series(["a", None, np.nan, "a", None, np.nan], dtype=object)
    assert distinct.by_value(mixed, kind).tolist() == ["str", "NoneType", "float"] * 2
    assert len(seen) == 3
    # text as pandas' strings and as categories: missing values are NaN there
    for dtype in ("str", "category"):
        seen.clear()
        column = pd.Series(["x", None, "y", "x"], dtype=dtype)
        assert distinct.by_value(column, kind).tolist() == ["str", "float", "str", "str"]
        assert len(seen) == 3, dtype


def test_float64_of_a_list_of_numbers_and_missing_values():
    assert distinct.float64_of([1, 2.5, None]).tolist()[:2] == [1.0, 2.5]
    assert np.isnan(distinct.float64_of([1, 2.5, None])[2])
    assert distinct.float64_of([0, 1 << 70]).tolist() == [0.0, float(1 << 70)]
