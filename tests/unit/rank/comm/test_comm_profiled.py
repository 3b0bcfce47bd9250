"""Records timed at issue only paired with the same ops of the profiled steps
(analysis.rank.comm.profiled.pair_with_profiled), against pairings worked out by hand."""

import numpy as np
import pandas as pd

from analysis.rank.comm.profiled import pair_with_profiled


def side(rows) -> pd.DataFrame:
    """(step, op, pg, bytes) rows in issue order."""
    return pd.DataFrame(rows, columns=["step", "op", "pg", "bytes"])


def test_the_kth_op_of_a_step_pairs_with_the_kth_in_the_trace():
    # Two buckets per step; the trace (gloo) names no group; step 5 was not profiled.
    records = side([(5, "all_reduce", "0", 8.0), (7, "all_reduce", "0", 8.0),
                    (7, "all_reduce", "0", 4.0), (8, "broadcast", "0", 2.0),
                    (8, "all_reduce", "0", 8.0), (8, "all_reduce", "0", 4.0)])
    trace = side([(7, "all_reduce", None, 8.0), (7, "all_reduce", None, 4.0),
                  (8, "all_reduce", None, 8.0), (8, "broadcast", None, 2.0),
                  (8, "all_reduce", None, 4.0)])
    assert pair_with_profiled(records, trace).tolist() == [-1, 0, 1, 3, 2, 4]


def test_a_step_whose_counts_differ_is_paired_by_size_where_they_agree():
    # The trace lost the 4-byte all-reduce of step 7 (dropped events): the 8-byte one still
    # pairs by its size, the 4-byte ones stay unpaired.
    records = side([(7, "all_reduce", "0", 8.0), (7, "all_reduce", "0", 4.0),
                    (7, "all_reduce", "0", 4.0)])
    trace = side([(7, "all_reduce", None, 4.0), (7, "all_reduce", None, 8.0)])
    assert pair_with_profiled(records, trace).tolist() == [1, -1, -1]


def test_an_order_that_disagrees_on_size_or_group_pairs_nothing_of_its_step():
    records = side([(7, "all_reduce", "0", 8.0), (7, "all_reduce", "0", 4.0)])
    swapped = side([(7, "all_reduce", None, 4.0), (7, "all_reduce", None, 8.0)])
    # By order the sizes disagree; by size each pairs with its own.
    assert pair_with_profiled(records, swapped).tolist() == [1, 0]
    other_group = side([(7, "all_reduce", "1", 8.0), (7, "all_reduce", "1", 4.0)])
    assert pair_with_profiled(records, other_group).tolist() == [-1, -1]
    # Sizes the trace does not know (no shapes recorded) do not stand in the way.
    unsized = side([(7, "all_reduce", None, np.nan), (7, "all_reduce", None, np.nan)])
    assert pair_with_profiled(records, unsized).tolist() == [0, 1]


def test_nothing_to_pair_gives_no_pair():
    records = side([(7, "all_reduce", "0", 8.0)])
    assert pair_with_profiled(records, side([])).tolist() == [-1]
    assert pair_with_profiled(side([]), records).tolist() == []
