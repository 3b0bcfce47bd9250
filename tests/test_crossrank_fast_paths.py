"""The cross-rank pass's array shortcuts against hand-computed answers on small built frames:
missing members counted on arrays (matching._none_missing), runs without p2p ops, values keyed
without a call per row (frames._by_value) and message sizes computed once per distinct message
(frames._message_sizes)."""

import math

import numpy as np
import pandas as pd

from analysis.crossrank.clock import clock_table, estimate_offsets
from analysis.crossrank.frames import OP_COLUMNS, _by_value, _message_sizes, typed_ops
from analysis.crossrank.matching import (
    MISMATCH_COLUMNS,
    _missing_ranks,
    _none_missing,
    group_members,
    match_ops,
)


def op(rank, issue, step=0, pg="0", size=3, name="all_reduce", peer=None):
    return {"rank": rank, "pg": pg, "pg_size": size, "op": name, "bytes": 4096.0,
            "dtype": "float32", "step": step, "issue_ns": issue, "end_ns": issue + 5,
            "peer": np.nan if peer is None else peer, "queue": pg}


def collectives(rows):
    frame = typed_ops(pd.DataFrame(rows))
    frame["position"] = frame.groupby(["rank", "pg", "step"]).cumcount()
    return frame


def codes_of(frame):
    return frame.groupby(["pg", "step", "position"], sort=True).ngroup().to_numpy()


def coverage(pairs):
    return pd.DataFrame(pairs, columns=["rank", "step"])


def check_missing(frame, world_size, covered):
    """(_none_missing's answer, _missing_ranks as {(pg, step, position): ranks})."""
    members = group_members(frame, world_size)
    quick = _none_missing(frame, codes_of(frame), members, covered)
    return quick, _missing_ranks(frame, members, covered).to_dict()


def test_missing_members_counted_on_arrays_agree_with_the_merges():
    # world 3: group "0" is the whole world, group "1" holds ranks 0 and 2
    every = [op(r, 10 * r, step=s) for s in (0, 1) for r in (0, 1, 2)]
    group_1 = [op(0, 1, pg="1", size=2), op(2, 21, pg="1", size=2)]
    all_covered = coverage([(r, s) for r in (0, 1, 2) for s in (0, 1)])
    assert check_missing(collectives(every + group_1), 3, all_covered) == (True, {})

    # rank 2 has no step 1 in its trace: it is not expected there
    no_step_1 = [row for row in every if not (row["rank"] == 2 and row["step"] == 1)]
    partly = coverage([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)])
    assert check_missing(collectives(no_step_1), 3, partly) == (True, {})
    # ... but where it covers step 1, it is missing there
    assert check_missing(collectives(no_step_1), 3, all_covered) == (False, {("0", 1, 0): "2"})

    # group "1": rank 2 misses its second op of step 0
    second = group_1 + [op(0, 2, pg="1", size=2)]
    assert check_missing(collectives(every + second), 3, all_covered) == (
        False, {("1", 0, 1): "2"})

    # a rank outside the world (rank 3 of a world of 3) is no member of the whole-world group
    outsider = collectives(every + [op(3, 30)])
    assert check_missing(outsider, 3, coverage([(r, s) for r in range(4) for s in (0, 1)])) == (
        True, {})


def test_missing_members_fall_back_to_the_merges_where_arrays_cannot_tell():
    frame = collectives([op(0, 0), op(1, 10)])
    members = group_members(frame, 2)
    assert not _none_missing(frame.iloc[:0], codes_of(frame.iloc[:0]), members,
                             coverage([(0, 0)]))
    with_nan_step = pd.DataFrame({"rank": [0, 1], "step": [0, np.nan]})
    assert not _none_missing(frame, codes_of(frame), members, with_nan_step)


def test_match_ops_names_a_missing_member_found_on_arrays():
    rows = [op(r, 10 * r, step=s) for s in (0, 1) for r in (0, 1, 2)] + [op(0, 50, step=1)]
    matched, mismatches = match_ops(typed_ops(pd.DataFrame(rows)), 3)
    assert mismatches.to_dict("records") == [{
        "pg": "0", "step": 1, "position": 1, "problem": "some members never issued it",
        "ranks": "all_reduce 4096 B float32 on rank 0", "missing_ranks": "1-2"}]
    assert sorted(matched["instance"].tolist()) == [-1, 0, 0, 0, 1, 1, 1]


def test_a_run_without_p2p_ops_keeps_the_columns_and_types():
    matched, mismatches = match_ops(typed_ops(pd.DataFrame([op(0, 0), op(1, 10)])), 2)
    assert list(matched.columns) == OP_COLUMNS + ["position", "instance"]
    assert matched["instance"].tolist() == [0, 0]
    assert (matched[["position", "instance"]].dtypes == "int64").all()
    assert list(mismatches.columns) == MISMATCH_COLUMNS and mismatches.empty
    assert all(dtype == np.dtype(object) for dtype in mismatches.dtypes)

    with_p2p = typed_ops(pd.DataFrame([op(0, 0), op(1, 10), op(0, 20, name="send", peer=1)]))
    matched, mismatches = match_ops(with_p2p, 2)
    assert matched["instance"].tolist() == [0, 0, -1]
    assert mismatches["problem"].tolist() == ["a send with no matching recv"]


def test_values_are_keyed_by_value_plain_or_not():
    seen = []

    def upper(value):
        seen.append(value)
        return None if value is None else str(value).upper()

    plain = pd.Series(["a", "b", "a", None, "a"], index=[5, 6, 7, 8, 9], dtype=object)
    result = _by_value(plain, upper)
    assert result.tolist() == ["A", "B", "A", None, "A"]
    assert list(result.index) == [5, 6, 7, 8, 9] and result.dtype == object
    assert seen == ["a", "b", None]  # once per distinct value

    seen.clear()
    # a list or a numpy integer is keyed by its text, as before
    mixed = pd.Series([[1, 2], "x", [1, 2], np.int64(3)], dtype=object)
    assert _by_value(mixed, upper).tolist() == ["[1, 2]", "X", "[1, 2]", "3"]
    assert seen == ["[1, 2]", "x", "3"]
    assert _by_value(pd.Series([], dtype=object), upper).tolist() == []


def test_message_sizes_once_per_distinct_message_keep_none_and_nan_apart():
    sizes = _message_sizes(
        ["all_reduce", "all_reduce", "all_reduce", "all_reduce", "all_gather", "all_reduce"],
        [0, 0, 1024.0, 1024, 256.0, float("nan")],
        [None, float("nan"), float("nan"), None, float("nan"), float("nan")],
        ["float32", "float32", "float32", "float32", "bfloat16", "float32"],
        [2, 2, 2, 2, 4, 2])
    # a zero-element op with no output count moved nothing; with an unknown one, unknown
    assert sizes[0] == 0.0 and math.isnan(sizes[1])
    assert sizes[2] == sizes[3] == 4096.0
    assert sizes[4] == 256 * 4 * 2.0  # all_gather without its output: input x group x 2 B
    assert math.isnan(sizes[5])
    assert _message_sizes([], [], [], [], []) == []


def test_no_matched_synchronising_collective_leaves_the_clock_unestimated():
    # a broadcast does not synchronise; an all_reduce issued on one rank only is not matched
    rows = [op(0, 0, name="broadcast", size=2), op(1, 10, name="broadcast", size=2),
            op(0, 20, size=2)]
    matched, _ = match_ops(typed_ops(pd.DataFrame(rows)), 2, coverage([(0, 0)]))
    estimate = estimate_offsets(matched)
    assert estimate.empty and list(estimate.columns) == [
        "rank", "offset_ns", "drift", "uncertainty_ns", "instances", "t0"]
    sync = pd.DataFrame(columns=["rank", "offset_ns", "uncertainty_ns"])
    table = clock_table(matched, sync, {0, 1})
    assert table["source"].tolist() == ["reference", "none"]
    assert table["offset_ns"].tolist() == [0, 0] and table.attrs["t0"] == 0
