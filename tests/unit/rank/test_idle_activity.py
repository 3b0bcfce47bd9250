"""Idle gaps summed by host activity (analysis.rank.idle_activity), on hand-built frames with
hand-computed answers: only the gaps of analysed (rank, step) rows with a positive duration."""

import numpy as np
import pandas as pd

from analysis.core.steps import WHOLE_TRACE_STEP
from analysis.rank.idle_activity import ACTIVITY_COLUMNS, RANK_COLUMNS, idle_by_activity


def _steps(keys):
    """analysed_steps' frame: float64 rank and step."""
    return pd.DataFrame({"rank": [float(r) for r, _ in keys], "step": [float(s) for _, s in keys],
                         "step_ns": 1000.0})


def _gaps(rows):
    """idle_gaps' frame: int64 rank, step and dur_ns, text activity."""
    return pd.DataFrame(rows, columns=["rank", "step", "dur_ns", "host_activity"]).astype(
        {"rank": "int64", "step": "int64", "dur_ns": "int64", "host_activity": "str"})


def test_known_answer():
    steps = _steps([(0, 1), (1, 1), (1, 2)])
    gaps = _gaps([
        (0, 1, 30, "launch"), (1, 1, 50, "launch"), (1, 2, 50, "launch"),  # two longest: first
        (0, 2, 999, "launch"),  # step 2 of rank 0 is not analysed
        (1, 2, 0, "sync"),  # zero-length
        (0, 1, 20, "data_loading"), (1, 2, 5, "data_loading"),
    ])
    activities, by_rank = idle_by_activity(steps, gaps)
    assert activities.to_dict("records") == [
        {"host_activity": "data_loading", "dur_ns": 25, "gaps": 2, "longest_ns": 20,
         "longest_rank": 0, "longest_step": 1},
        {"host_activity": "launch", "dur_ns": 130, "gaps": 3, "longest_ns": 50,
         "longest_rank": 1, "longest_step": 1},
    ]
    assert by_rank.to_dict("records") == [
        {"host_activity": "data_loading", "rank": 0, "dur_ns": 20},
        {"host_activity": "data_loading", "rank": 1, "dur_ns": 5},
        {"host_activity": "launch", "rank": 0, "dur_ns": 30},
        {"host_activity": "launch", "rank": 1, "dur_ns": 100},
    ]
    assert activities["dur_ns"].dtype == np.int64 and by_rank["rank"].dtype == np.int64


def test_a_step_listed_twice_counts_its_gaps_twice():
    activities, by_rank = idle_by_activity(_steps([(0, 1), (0, 1)]), _gaps([(0, 1, 10, "launch")]))
    assert activities[["dur_ns", "gaps", "longest_ns"]].values.tolist() == [[20, 2, 10]]
    assert by_rank.to_dict("records") == [{"host_activity": "launch", "rank": 0, "dur_ns": 20}]


def test_a_trace_analysed_whole_and_one_rank():
    # A trace without ProfilerStep is one window, step -1; its gaps count like any step's.
    whole = WHOLE_TRACE_STEP
    gaps = _gaps([(3, whole, 40, "other"), (3, whole, 60, "other"), (3, whole, 60, "other"),
                  (3, 0, 7, "other")])
    activities, by_rank = idle_by_activity(_steps([(3, whole)]), gaps)
    assert activities.to_dict("records") == [
        {"host_activity": "other", "dur_ns": 160, "gaps": 3, "longest_ns": 60,
         "longest_rank": 3, "longest_step": whole}]
    assert by_rank.to_dict("records") == [{"host_activity": "other", "rank": 3, "dur_ns": 160}]


def test_far_apart_ranks_and_sums_past_float_precision():
    # 2**52 + (2**52 + 1) = 2**53 + 1: a float64 sum would give 2**53.
    far = 10**9
    gaps = _gaps([(0, 1, 2**52, "other"), (0, 1, 2**52 + 1, "other"), (far, 1, 5, "other")])
    activities, by_rank = idle_by_activity(_steps([(0, 1), (far, 1)]), gaps)
    assert activities["dur_ns"].tolist() == [2**53 + 6]
    assert activities["longest_ns"].tolist() == [2**52 + 1]
    assert by_rank[["rank", "dur_ns"]].values.tolist() == [[0, 2**53 + 1], [far, 5]]


def test_gaps_without_rank_or_activity_count_in_none():
    gaps = _gaps([(0, 1, 10, "launch"), (0, 1, 20, "sync"), (1, 1, 40, "launch")])
    gaps["host_activity"] = pd.Series(["launch", None, "launch"], dtype="str")
    gaps["rank"] = pd.Series([0, 0, None], dtype=object)  # a rank that is not known
    activities, by_rank = idle_by_activity(_steps([(0, 1), (1, 1)]), gaps)
    assert activities[["host_activity", "dur_ns", "gaps"]].values.tolist() == [["launch", 10, 1]]
    assert by_rank[["rank", "dur_ns"]].values.tolist() == [[0, 10]]


def test_float_durations_are_summed_as_floats():
    gaps = _gaps([(0, 1, 10, "launch"), (0, 1, 2, "launch")]).astype({"dur_ns": "float64"})
    gaps.loc[1, "dur_ns"] = 2.5
    activities, _ = idle_by_activity(_steps([(0, 1)]), gaps)
    assert activities["dur_ns"].tolist() == [12.5] and activities["longest_ns"].tolist() == [10.0]


def test_no_analysed_step_or_no_gap_gives_empty_tables():
    gaps = _gaps([(0, 1, 10, "launch")])
    for steps, idle in ((_steps([]), gaps), (_steps([(0, 1)]), gaps.iloc[:0]),
                        (_steps([(0, 2)]), gaps)):
        activities, by_rank = idle_by_activity(steps, idle)
        assert activities.empty and list(activities.columns) == ACTIVITY_COLUMNS
        assert by_rank.empty and list(by_rank.columns) == RANK_COLUMNS
