"""The cross-rank pass's array paths against hand-computed answers on small built frames: group
members and positions counted on arrays, matching without groupby aggregations where nothing
mismatches, no per-queue work where nothing is matched (a lone rank's trace), and kernels
named from their host ops by one array write per column."""

import math

import numpy as np
import pandas as pd
import pytest
from test_comm_fast_paths import four_ops, text_kinds
from test_communication import events_frame

from analysis.crossrank.frames import OP_COLUMNS, typed_ops
from analysis.crossrank.matching import _positions, group_members, match_ops
from analysis.crossrank.waits import op_waits, rank_step_waits
from analysis.rank.comm.events import kernel_host_ops
from analysis.rank.comm.kernel_names import _named_by_labels, named_kernels


def op(rank, issue, step=0, pg="0", size=3, name="all_reduce", nbytes=4096.0, dtype="float32"):
    return {"rank": rank, "pg": pg, "pg_size": size, "op": name, "bytes": nbytes,
            "dtype": dtype, "step": step, "issue_ns": issue, "end_ns": issue + 5,
            "peer": np.nan, "queue": pg}


def test_group_members_in_order_of_first_use_then_the_whole_world_groups():
    frame = typed_ops(pd.DataFrame([op(2, 0, pg="b", size=2), op(0, 1, pg="w"),
                                    op(0, 2, pg="b", size=2), op(2, 3, pg="b", size=2),
                                    op(1, 4, pg="a", size=2), op(1, 5, pg="a", size=1)]))
    members = group_members(frame, 3)
    assert members.to_dict("list") == {"pg": ["b", "b", "a", "w", "w", "w"],
                                       "rank": [2, 0, 1, 0, 1, 2]}
    assert members["pg"].dtype == object and members["rank"].dtype == "int64"
    assert all(type(pg) is str for pg in members["pg"])
    # groups named by numbers take the pandas calls, with the same answer
    numbered = frame.assign(pg=frame["pg"].map({"b": 7, "w": 9, "a": 8}).astype(object))
    assert group_members(numbered, 3).to_dict("list") == {"pg": [7, 7, 8, 9, 9, 9],
                                                          "rank": [2, 0, 1, 0, 1, 2]}


def test_positions_count_a_rank_s_ops_per_group_and_step_in_row_order():
    frame = typed_ops(pd.DataFrame([op(1, 0), op(0, 1), op(1, 2, pg="x"), op(1, 3),
                                    op(1, 4, step=1), op(0, 5), op(1, 6)]))
    assert _positions(frame).tolist() == [0, 0, 0, 1, 0, 1, 2]
    assert _positions(frame.iloc[:0]).tolist() == []


def test_matching_without_mismatch_numbers_instances_in_key_order():
    # keys sorted by (pg, step, position): ("0", 0, 0), ("0", 0, 1), ("0", 1, 0), ("a", 0, 0)
    rows = [op(r, 10 * r + t, step=s, pg=pg, size=2) for r in (1, 0)
            for t, (pg, s) in enumerate([("a", 0), ("0", 1), ("0", 0), ("0", 0)])]
    rows.append(op(0, 90, step=1, pg="solo", size=1))  # one member: not matched
    matched, mismatches = match_ops(typed_ops(pd.DataFrame(rows)), 2)
    assert list(matched.columns) == OP_COLUMNS + ["position", "instance"]
    by_op = matched.set_index(["rank", "issue_ns"])
    assert by_op["instance"].to_dict() == {
        (0, 0): 3, (0, 1): 2, (0, 2): 0, (0, 3): 1, (0, 90): -1,
        (1, 10): 3, (1, 11): 2, (1, 12): 0, (1, 13): 1}
    assert mismatches.empty and list(mismatches.columns) == [
        "pg", "step", "position", "problem", "ranks", "missing_ranks"]


def test_a_dtype_or_size_that_differs_is_still_a_mismatch():
    rows = [op(0, 0, size=2), op(1, 1, size=2, dtype="float16"),
            op(0, 2, size=2, nbytes=np.nan), op(1, 3, size=2)]
    matched, mismatches = match_ops(typed_ops(pd.DataFrame(rows)), 2)
    assert matched["instance"].tolist() == [-1, 1, -1, 1]
    assert mismatches[["position", "problem"]].to_dict("list") == {
        "position": [0], "problem": ["members disagree on op, size or dtype"]}


def test_nothing_matched_gives_no_waits_and_zeros_per_step():
    lone = typed_ops(pd.DataFrame([op(1, 0, step=4), op(1, 10, step=2)]))
    lone["position"], lone["instance"] = 0, -1
    waits = op_waits(lone)
    assert waits.empty and list(waits.columns) == list(lone.columns) + [
        "arrival_ns", "last_arrival_ns", "last_rank", "wait_ns", "transfer_ns", "queued_ns"]
    assert (waits.dtypes.iloc[-6:] == "int64").all()
    steps = pd.DataFrame({"rank": [1, 1, 0, 1], "step": [4, 2, 3, 2]})
    table = rank_step_waits(waits, steps)
    assert table.to_dict("list") == {"rank": [0, 1, 1], "step": [3, 2, 4],
                                     "wait_for_peers_ms": [0.0] * 3, "transfer_ms": [0.0] * 3,
                                     "queued_ms": [0.0] * 3, "ops": [0, 0, 0]}
    assert table["ops"].dtype == "int64" and table["queued_ms"].dtype == "float64"


# Labels 3, 23, ..., 93: the four kernels are 23, 53, 63 (no launch found) and 93.
NAMED = {
    "collective": [math.nan, "all_gather", math.nan, "all_reduce", math.nan, "send", "send"],
    "in_nelems": [math.nan, math.nan, 1024.0, 256.0, math.nan, 100.0, 100.0],  # 53: its own
    "comm_dtype": [math.nan, math.nan, "Float", "Half", math.nan, "Float", "Float"],
    "group_size": [math.nan, math.nan, 2.0, 2.0, math.nan, math.nan, 2.0],  # 93: its own
    "pg_name": [math.nan, "7", "0", "0", math.nan, "5", "9"],
    "input_dims": ["[[2, 3], [5]]", "[[2, 3], [5]]"] + [math.nan] * 5,
}


def typed_values(column: pd.Series) -> list:
    return [(type(v), "nan" if isinstance(v, float) and math.isnan(v) else v) for v in column]


@pytest.mark.parametrize("kind", range(3))
def test_kernels_take_their_host_op_s_name_and_the_arguments_they_lack(kind):
    events = text_kinds(events_frame(four_ops()))[kind]
    events.index = events.index * 10 + 3  # labels that are not positions
    named = named_kernels(events)
    assert named.index.tolist() == [3, 23, 33, 53, 63, 73, 93]
    for column, expected in NAMED.items():
        assert named[column].dtype == object, column
        # a float64 column's values as Python floats, as column.astype(object) holds them
        assert typed_values(named[column]) == typed_values(pd.Series(expected, dtype=object)), (
            column)
    assert list(named.columns) == list(events.columns)
    by_labels = _named_by_labels(events[events["is_comm"]], kernel_host_ops(events)
                                 .query("host >= 0"), events)
    for column in named.columns:
        assert typed_values(named[column]) == typed_values(by_labels[column]), column


def test_kernels_get_a_collective_column_where_the_trace_has_none():
    events = events_frame(four_ops()).drop(columns=["collective", "in_nelems"])
    named = named_kernels(events)
    assert list(named.columns) == list(events.columns) + ["collective"]
    assert "in_nelems" not in named.columns
    # 93: launched in a record_param_comms call that no longer names its op: not named
    assert typed_values(named["collective"]) == typed_values(pd.Series(
        [None, "all_gather", None, "all_reduce", None, None, None], dtype=object))
