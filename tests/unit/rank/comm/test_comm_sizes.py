"""Message sizes in bytes (analysis.rank.comm.sizes), computed once per distinct message: the
same few messages repeat in every step. Equal numbers are one message, every NaN is alike, None
stays apart from NaN, and a value that cannot be a key sizes its row on its own."""

import math

import numpy as np
import pandas as pd

from analysis.rank.comm import sizes as comm_sizes


def test_message_sizes_as_worked_out_by_hand_keep_none_and_nan_apart():
    sizes = comm_sizes.message_sizes(
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
    assert comm_sizes.message_sizes([], [], [], [], []) == []


def test_each_distinct_message_is_sized_once_from_its_first_row(monkeypatch):
    calls = []

    def counted(*row):
        calls.append(row)
        return len(calls)

    monkeypatch.setattr(comm_sizes, "message_bytes", counted)
    sizes = comm_sizes.message_sizes(
        pd.Series(["all_reduce"] * 6, dtype=object),
        pd.Series([1.0, 1.0, np.nan, np.nan, 2.0, np.nan]),
        np.array([np.nan] * 6),
        pd.Series(["Float", "Float", None, None, "Float", np.nan], dtype=object),
        np.array([2, 2, 2, 2, 2, 2]))
    # rows 2 and 3 are one message; row 5's dtype is NaN, not None: another message
    assert sizes == [1, 1, 2, 2, 3, 4]
    assert [type(v) for v in calls[0]] == [str, float, float, int, int]  # dtype_size(Float)


def test_message_sizes_of_unhashable_values_are_computed_row_by_row():
    # An "In msg nelems" that is a JSON list cannot be a key: each row is sized on its own.
    sizes = comm_sizes.message_sizes(["all_reduce", "all_reduce"], [[4], 8.0], [None, None],
                                     ["float32", "float32"], [2, 2])
    assert len(sizes) == 2 and math.isnan(sizes[0])  # a list is no count
    assert sizes[1] == 32.0  # 8 float32 elements
    sizes, inverse = comm_sizes.distinct_message_sizes(
        np.array(["all_reduce"] * 3, dtype=object), np.array([[4], [4], 8.0], dtype=object),
        [None] * 3, ["float32"] * 3, [2] * 3)
    assert inverse.tolist() == [0, 1, 2] and sizes[2] == 32.0
