"""rank_totals' array path (integer ranks, every row with a kind) against hand-computed sums."""

import numpy as np
import pandas as pd

from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS, TOTALS_COLUMNS, rank_totals


def _per_step(ranks, kinds, kind_dtype=object):
    rows = len(ranks)
    frame = pd.DataFrame({"rank": np.array(ranks, dtype=np.int64), "step": np.arange(rows)})
    for offset, column in enumerate(BREAKDOWN_NS_COLUMNS):
        frame[column] = (np.arange(rows, dtype=np.int64) + 1) * 10 ** offset
    frame["overlap_pct"] = 0.0
    frame["kind"] = pd.Series(kinds, dtype=kind_dtype)
    frame["start_ns"] = 0
    frame["end_ns"] = 1
    return frame


def test_ranks_in_order_of_first_appearance_with_their_sums():
    totals = rank_totals(_per_step([3, 1, 3, 2, 1], ["gpu", "cpu", "cpu", "gpu", "gpu"]))
    assert list(totals.columns) == TOTALS_COLUMNS
    assert totals["rank"].tolist() == [3, 1, 2]
    assert totals["steps"].tolist() == [2, 2, 1]
    # rows (1-based) of rank 3: 1 and 3; of rank 1: 2 and 5; of rank 2: 4
    assert totals["step_ns"].tolist() == [4, 7, 4]
    assert totals["compute_only_ns"].tolist() == [40, 70, 40]
    assert totals["kind"].tolist() == ["gpu", "cpu", "gpu"]
    comm = totals["comm_only_ns"].to_numpy() + totals["overlap_ns"].to_numpy()
    assert totals["overlap_pct"].tolist() == (100.0 * totals["overlap_ns"] / comm).tolist()
    assert [str(d) for d in totals.dtypes[:-1]] == ["int64"] * 9 + ["float64"]
    assert isinstance(totals.index, pd.RangeIndex) and totals.index.tolist() == [0, 1, 2]


def test_kind_keeps_its_dtype_and_a_missing_kind_reads_the_first_present():
    totals = rank_totals(_per_step([0, 0], ["gpu", "gpu"], kind_dtype="str"))
    assert totals["kind"].dtype == pd.Series(["gpu"], dtype="str").dtype
    totals = rank_totals(_per_step([5, 5, 6], [None, "cpu", "gpu"]))
    assert totals["kind"].tolist() == ["cpu", "gpu"]
    assert totals["steps"].tolist() == [2, 1]


def test_shared_layers_give_the_tables_computed_alone():
    from types import SimpleNamespace

    from analysis.core.steps import WHOLE_TRACE_STEP
    from analysis.rank.idle import idle_gaps
    from analysis.rank.step_breakdown import breakdown_per_step, kind_and_layers

    events = pd.DataFrame({
        "name": pd.Categorical(["k1", "nccl", "k2"]), "cat": pd.Categorical(["kernel"] * 3),
        "ts_ns": np.array([0, 5, 30], dtype=np.int64), "end_ns": np.array([10, 20, 40]),
        "dur_ns": np.array([10, 15, 10]), "is_gpu": [True] * 3, "is_comm": [False, True, False],
        "pid": pd.Categorical(["1"] * 3), "tid": pd.Categorical(["7"] * 3),
        "correlation": np.array([-1, -1, -1]), "stream": np.array([7, 7, 7])})
    steps = pd.DataFrame({"step": [WHOLE_TRACE_STEP], "start_ns": [0], "end_ns": [40]})
    trace = SimpleNamespace(events=events, steps=steps, all_steps=None, rank=0)
    shared = kind_and_layers(trace)
    per_step = breakdown_per_step(trace, shared)
    pd.testing.assert_frame_equal(per_step, breakdown_per_step(trace), check_exact=True)
    # compute 0-5 alone, overlap 5-10, comm 10-20 alone, idle 20-30, compute 30-40
    assert per_step[["compute_only_ns", "overlap_ns", "comm_only_ns", "idle_ns"]].values.tolist() \
        == [[15, 5, 10, 10]]
    gaps = idle_gaps(trace, shared)
    pd.testing.assert_frame_equal(gaps, idle_gaps(trace), check_exact=True)
    assert gaps[["start_ns", "end_ns"]].values.tolist() == [[20, 30]]
