"""Idle time per rank and host activity (analysis.rank.idle.idle_summary) and the gaps relabelled
as waits for peers (label_peer_waits), on small frames with answers worked out by hand."""

import numpy as np
import pandas as pd
import pytest

from analysis.rank import idle


# ---- idle_summary -------------------------------------------------------------------------------
def _gaps(rank, dur_ns, activity) -> pd.DataFrame:
    ends = np.cumsum(dur_ns)
    return pd.DataFrame({"rank": rank, "step": 1, "start_ns": ends - np.asarray(dur_ns),
                         "end_ns": ends, "dur_ns": dur_ns, "host_activity": activity})


# Rank 0: other 100 + 50, data_loading 30; rank 2: synchronisation 7, other 3 (no rank 1).
GAP_DURATIONS = [100, 30, 7, 50, 3]
GAP_ACTIVITIES = ["other", "data_loading", "synchronisation", "other", "other"]
# (activity, gaps, total_ns) per rank, by hand from the lists above, in activity order.
RANK_0_SUMMARY = [("data_loading", 1, 30), ("other", 2, 150)]
RANK_2_SUMMARY = [("other", 1, 3), ("synchronisation", 1, 7)]


def _rows(summary: pd.DataFrame) -> list[tuple]:
    return [(None if pd.isna(r) else int(r), a, int(n), int(t))
            for r, a, n, t in summary[["rank", "host_activity", "gaps", "total_ns"]]
            .itertuples(index=False)]


def test_idle_summary_sums_per_rank_and_activity_in_order():
    summary = idle.idle_summary(_gaps([0, 0, 2, 0, 2], GAP_DURATIONS, GAP_ACTIVITIES))
    assert _rows(summary) == ([(0, *row) for row in RANK_0_SUMMARY]
                              + [(2, *row) for row in RANK_2_SUMMARY])
    assert summary["total_ns"].sum() == sum(GAP_DURATIONS) == 190
    assert [str(d) for d in summary.dtypes[["rank", "gaps", "total_ns"]]] == ["int64"] * 3


def test_idle_summary_of_far_apart_ranks():
    far = 10**9
    summary = idle.idle_summary(_gaps([0, 0, far, 0, far], GAP_DURATIONS, GAP_ACTIVITIES))
    assert _rows(summary) == ([(0, *row) for row in RANK_0_SUMMARY]
                              + [(far, *row) for row in RANK_2_SUMMARY])


@pytest.mark.parametrize("missing", [None, np.nan])
def test_idle_summary_gaps_without_rank_come_last_under_none(missing):
    # Rank 2's gaps lose their rank: their activities stay apart under rank None.
    gaps = _gaps([0, 0, missing, 0, missing], GAP_DURATIONS, GAP_ACTIVITIES)
    expected = [(0, *row) for row in RANK_0_SUMMARY] + [(None, *row) for row in RANK_2_SUMMARY]
    assert _rows(idle.idle_summary(gaps)) == expected


def test_idle_summary_sums_past_float_precision_stay_exact():
    # 2**52 + (2**52 + 1) = 2**53 + 1: a float64 sum would give 2**53.
    gaps = _gaps([3, 3], [2**52, 2**52 + 1], ["other", "other"])
    assert _rows(idle.idle_summary(gaps)) == [(3, "other", 2, 2**53 + 1)]


def test_idle_summary_leaves_out_gaps_without_activity_and_of_no_gap():
    gaps = _gaps([1, 1, 1], [5, 6, 7], ["other", None, "other"])
    assert _rows(idle.idle_summary(gaps)) == [(1, "other", 2, 12)]
    empty = idle.idle_summary(gaps.iloc[:0])
    assert empty.empty and list(empty.columns) == ["rank", "host_activity", "gaps", "total_ns"]


# ---- label_peer_waits ---------------------------------------------------------------------------
# (rank, start_ns, end_ns, label before, label after): relabelled where at least half the gap
# lies in its own rank's windows and the label is one a wait overrides.
PEER_WAIT_CASES = [
    (0, 0, 100, "other", "waiting_for_peers"),  # window [0, 60): 60 of 100
    (0, 200, 300, "launch_bound", "waiting_for_peers"),  # window [250, 300): exactly half
    (0, 400, 500, "data_loading", "data_loading"),  # wholly in [400, 500), but loading data
    (0, 600, 700, "other", "other"),  # no window
    (0, 800, 900, "other", "other"),  # window [800, 849): 49 of 100
    (1, 0, 100, "other", "other"),  # rank 1 has no window (rank 0's [0, 60) is not its own)
    (2, 0, 100, "synchronisation", "waiting_for_peers"),  # window [50, 120): exactly half
    (2, 150, 250, "other", "waiting_for_peers"),  # [160, 200) + [230, 250): 60 of 100
    (2, 300, 400, "other", "other"),  # no window reaches it
]
PEER_WAIT_WINDOWS = pd.DataFrame(
    [(2, 230, 250), (0, 0, 60), (0, 250, 300), (2, 50, 120), (0, 400, 500), (0, 800, 849),
     (2, 160, 200)], columns=["rank", "start_ns", "end_ns"])


def _peer_wait_gaps(dtype) -> pd.DataFrame:
    rank, start, end, before, _ = zip(*PEER_WAIT_CASES)
    gaps = pd.DataFrame({"rank": rank, "step": 1, "start_ns": start, "end_ns": end})
    gaps["dur_ns"] = gaps["end_ns"] - gaps["start_ns"]
    gaps["host_activity"] = pd.Series(before, dtype=dtype)
    return gaps[idle.IDLE_GAP_COLUMNS]


@pytest.mark.parametrize("dtype", [object, "string", "str"])
def test_label_peer_waits_relabels_only_gaps_half_inside_their_own_windows(dtype):
    gaps = _peer_wait_gaps(dtype)
    labelled = idle.label_peer_waits(gaps, PEER_WAIT_WINDOWS)
    assert list(labelled["host_activity"]) == [after for *_, after in PEER_WAIT_CASES]
    assert list(labelled["dur_ns"]) == [100] * len(PEER_WAIT_CASES)
    pd.testing.assert_frame_equal(labelled.drop(columns="host_activity"),
                                  gaps.drop(columns="host_activity"))
    assert list(gaps["host_activity"]) == [before for *_, before, _ in PEER_WAIT_CASES]


def test_label_peer_waits_without_windows_returns_the_gaps():
    gaps = _peer_wait_gaps(object)
    assert idle.label_peer_waits(gaps, PEER_WAIT_WINDOWS.iloc[:0]) is gaps
    assert idle.label_peer_waits(gaps, None) is gaps
