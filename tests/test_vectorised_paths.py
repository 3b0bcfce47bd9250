"""The per-rank computations done on arrays, each on a small frame with answers worked out by
hand, and each against its plain per-rank form (the groupby or scan it replaced): idle_summary,
label_peer_waits, the JSON document's per-rank steps, per_rank_table and the cross-rank pass's
step of each op."""

import json

import numpy as np
import pandas as pd
import pytest

from analysis.core.steps import step_at
from analysis.crossrank.frames import _steps_by_rank
from analysis.rank import idle
from analysis.rank import tables as ranks
from analysis.report.output import (
    WINDOW_NONE,
    WINDOW_STEPS,
    WINDOW_WHOLE_TRACE,
    steps_by_rank,
    window_of,
)


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


def _summary_by_groupby(gaps: pd.DataFrame, monkeypatch) -> pd.DataFrame:
    """idle_summary with the counting path refused: the groupby it replaced."""
    with monkeypatch.context() as patched:
        patched.setattr(idle, "_counted_summary", lambda _gaps: None)
        return idle.idle_summary(gaps)


def test_idle_summary_counted_equals_groupby_on_hand_sums(monkeypatch):
    gaps = _gaps([0, 0, 2, 0, 2], GAP_DURATIONS, GAP_ACTIVITIES)
    assert idle._counted_summary(gaps) is not None  # plain near ranks: the counting path
    expected = [(0, *row) for row in RANK_0_SUMMARY] + [(2, *row) for row in RANK_2_SUMMARY]
    counted = idle.idle_summary(gaps)
    assert _rows(counted) == expected
    assert _rows(_summary_by_groupby(gaps, monkeypatch)) == expected
    assert counted["total_ns"].sum() == sum(GAP_DURATIONS) == 190


def test_idle_summary_far_apart_ranks_take_the_groupby_with_the_same_table(monkeypatch):
    far = 10**9
    gaps = _gaps([0, 0, far, 0, far], GAP_DURATIONS, GAP_ACTIVITIES)
    assert idle._counted_summary(gaps) is None  # a billion slots: refused
    expected = [(0, *row) for row in RANK_0_SUMMARY] + [(far, *row) for row in RANK_2_SUMMARY]
    assert _rows(idle.idle_summary(gaps)) == expected
    near = _rows(idle.idle_summary(_gaps([0, 0, 2, 0, 2], GAP_DURATIONS, GAP_ACTIVITIES)))
    assert [row[1:] for row in _rows(idle.idle_summary(gaps))] == [row[1:] for row in near]


@pytest.mark.parametrize("missing", [None, np.nan])
def test_idle_summary_gaps_without_rank_come_last_under_none(missing):
    # Rank 2's gaps lose their rank: their activities stay apart under rank None.
    gaps = _gaps([0, 0, missing, 0, missing], GAP_DURATIONS, GAP_ACTIVITIES)
    assert idle._counted_summary(gaps) is None
    expected = [(0, *row) for row in RANK_0_SUMMARY] + [(None, *row) for row in RANK_2_SUMMARY]
    assert _rows(idle.idle_summary(gaps)) == expected


def test_idle_summary_sums_past_float_precision_stay_exact(monkeypatch):
    # 2**52 + (2**52 + 1) = 2**53 + 1: a float64 sum would give 2**53.
    gaps = _gaps([3, 3], [2**52, 2**52 + 1], ["other", "other"])
    assert idle._counted_summary(gaps) is None
    assert _rows(idle.idle_summary(gaps)) == [(3, "other", 2, 2**53 + 1)]
    assert _rows(_summary_by_groupby(gaps, monkeypatch)) == [(3, "other", 2, 2**53 + 1)]


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


def _labels_gap_by_gap(gaps: pd.DataFrame, windows: pd.DataFrame) -> list[str]:
    """The per-gap definition: the overlap with each of the rank's (disjoint) windows summed."""
    labels = []
    for gap in gaps.itertuples(index=False):
        own = windows[windows["rank"] == gap.rank]
        inside = (np.minimum(own["end_ns"], gap.end_ns)
                  - np.maximum(own["start_ns"], gap.start_ns)).clip(lower=0).sum()
        relabel = gap.host_activity in idle.PEER_WAIT_OVERRIDES and 2 * inside >= gap.dur_ns
        labels.append(idle.WAITING_FOR_PEERS if relabel else gap.host_activity)
    return labels


@pytest.mark.parametrize("dtype", [object, "string"])
def test_label_peer_waits_relabels_only_gaps_half_inside_their_own_windows(dtype):
    gaps = _peer_wait_gaps(dtype)
    labelled = idle.label_peer_waits(gaps, PEER_WAIT_WINDOWS)
    expected = [after for *_, after in PEER_WAIT_CASES]
    assert list(labelled["host_activity"]) == expected
    assert list(labelled["host_activity"]) == _labels_gap_by_gap(gaps, PEER_WAIT_WINDOWS)
    assert list(labelled["dur_ns"]) == [100] * len(PEER_WAIT_CASES)
    pd.testing.assert_frame_equal(labelled.drop(columns="host_activity"),
                                  gaps.drop(columns="host_activity"))
    assert list(gaps["host_activity"]) == [before for *_, before, _ in PEER_WAIT_CASES]


def test_label_peer_waits_without_windows_returns_the_gaps():
    gaps = _peer_wait_gaps(object)
    assert idle.label_peer_waits(gaps, PEER_WAIT_WINDOWS.iloc[:0]) is gaps
    assert idle.label_peer_waits(gaps, None) is gaps


# ---- the JSON document's per-rank steps ---------------------------------------------------------
def _steps_by_scan(per_step: pd.DataFrame, rank) -> list[int]:
    """The per-rank scan steps_by_rank replaced."""
    rows = per_step[per_step["rank"].isna()] if rank is None else per_step[per_step["rank"] == rank]
    return [int(s) for s in rows["step"]]


@pytest.mark.parametrize("rank_dtype", ["Int64", "float64"])
def test_steps_by_rank_and_window_as_the_document_prints_them(rank_dtype):
    per_step = pd.DataFrame({
        "rank": pd.array([1, 0, None, 1, 2], dtype=rank_dtype),
        "step": [4, 2, 5, 3, -1],  # table order kept: rank 1 is [4, 3]
    })
    by_rank = steps_by_rank(per_step)
    assert by_rank == {1: [4, 3], 0: [2], None: [5], 2: [-1]}
    for rank in (0, 1, 2, None):
        assert by_rank[rank] == _steps_by_scan(per_step, rank)
    printed = {rank: {"window": window_of(by_rank.get(rank, [])),
                      "steps_analysed": by_rank.get(rank, [])} for rank in (0, 1, 2, 3)}
    assert json.loads(json.dumps(printed)) == {
        "0": {"window": WINDOW_STEPS, "steps_analysed": [2]},
        "1": {"window": WINDOW_STEPS, "steps_analysed": [4, 3]},
        "2": {"window": WINDOW_WHOLE_TRACE, "steps_analysed": [-1]},
        "3": {"window": WINDOW_NONE, "steps_analysed": []},
    }
    assert (WINDOW_STEPS, WINDOW_WHOLE_TRACE, WINDOW_NONE) == ("steps", "whole trace", "none")
    assert steps_by_rank(per_step.iloc[:0]) == {}


# ---- per_rank_table -----------------------------------------------------------------------------
PER_RANK_STEPS = pd.DataFrame(
    # rank, step, step_ns, compute_only, comm_only, overlap, memcpy, idle, exposed_comm, kind
    [(0, 1, 100, 40, 10, 20, 0, 30, 10, "gpu"),
     (1, 1, 200, 100, 0, 0, None, 100, 0, "gpu"),
     (0, 2, 300, 100, 50, 60, 10, 80, 50, "cpu"),
     (1, 2, None, 50, 0, 0, 0, 60, 0, "cpu"),
     (2, 1, 500, 500, 0, 0, 0, 0, 0, None),
     (None, 1, 900, 900, 0, 0, 0, 0, 0, "gpu"),  # no rank: in no rank's row
     (1, 3, 400, 150, 0, 0, 30, 200, 0, "gpu")],
    columns=["rank", "step", "step_ns", "compute_only_ns", "comm_only_ns", "overlap_ns",
             "memcpy_ns", "idle_ns", "exposed_comm_ns", "kind"]).assign(overlap_pct=np.nan)

# By hand. Rank 0: gpu and cpu once each, the tie goes to the smaller, "cpu"; step_ns 100, 300;
# work = compute_only + overlap + memcpy = 60, 170; idle 110 and exposed 60 of 400 ns.
# Rank 1: gpu twice; step_ns 200, -, 400; memcpy -, 0, 30 (mean of the known); work 100, 50,
# 180; idle 360 and exposed 0 of 600 ns. Rank 2: no kind known. Fastest mean: rank 0's 200.
PER_RANK_EXPECTED = {
    "rank": [0, 1, 2], "kind": ["cpu", "gpu", None], "steps": [2, 3, 1],
    "mean_step_ns": [200.0, 300.0, 500.0], "median_step_ns": [200.0, 300.0, 500.0],
    "min_step_ns": [100.0, 200.0, 500.0], "max_step_ns": [300.0, 400.0, 500.0],
    "compute_only_ns": [70.0, 100.0, 500.0], "comm_only_ns": [30.0, 0.0, 0.0],
    "overlap_ns": [40.0, 0.0, 0.0], "memcpy_ns": [5.0, 15.0, 0.0],
    "idle_ns": [55.0, 120.0, 0.0], "exposed_comm_ns": [30.0, 0.0, 0.0],
    "work_ns": [115.0, 110.0, 500.0], "idle_pct": [27.5, 60.0, 0.0],
    "exposed_comm_pct": [15.0, 0.0, 0.0], "slowdown_vs_fastest_pct": [0.0, 50.0, 150.0],
    "slowest": [False, False, True],
}


def _rank_rows_by_groupby(frame: pd.DataFrame) -> list[dict]:
    """The pandas groupby _rank_step_rows replaced: Series reductions per rank."""
    rows = []
    for rank, group in frame.dropna(subset=["rank"]).groupby("rank", sort=True):
        step_ns = group["step_ns"].dropna()
        total_ns = step_ns.sum()
        row = {
            "rank": int(rank),
            "kind": group["kind"].dropna().mode().iloc[0] if group["kind"].notna().any() else None,
            "steps": int(group["step"].nunique()),
            "mean_step_ns": step_ns.mean(), "median_step_ns": step_ns.median(),
            "min_step_ns": step_ns.min(), "max_step_ns": step_ns.max(),
        }
        for column in [*ranks.BREAKDOWN_NS_COLUMNS[1:], "work_ns"]:
            row[column] = group[column].mean()
        for column, share in (("idle_ns", "idle_pct"), ("exposed_comm_ns", "exposed_comm_pct")):
            row[share] = group[column].sum() / total_ns * 100 if total_ns > 0 else np.nan
        rows.append(row)
    return rows


def test_per_rank_table_statistics_and_kind_tie_by_hand(monkeypatch):
    table = ranks.per_rank_table(PER_RANK_STEPS, None)
    for column, values in PER_RANK_EXPECTED.items():
        if column == "kind":
            assert [None if pd.isna(k) else k for k in table[column]] == values
        else:
            assert table[column].tolist() == pytest.approx(values, rel=1e-12), column
    monkeypatch.setattr(ranks, "_rank_step_rows", _rank_rows_by_groupby)
    pd.testing.assert_frame_equal(ranks.per_rank_table(PER_RANK_STEPS, None), table)


# ---- the cross-rank pass: each op's step on its own rank ----------------------------------------
CROSS_RANK_STEPS = pd.DataFrame(
    # Rank 1's steps straddle rank 0's: at 120 ns rank 0 is in step 2, rank 1 in step 1.
    [(1, 2, 150, 260), (0, 2, 100, 200), (2, 7, 1000, 1100), (1, 1, 50, 150), (0, 1, 0, 100)],
    columns=["rank", "step", "start_ns", "end_ns"])
# (rank, time, step): a step holds [start, end); rank 3 has no steps.
CROSS_RANK_TIMES = [
    (0, 50, 1.0), (1, 50, 1.0), (0, 120, 2.0), (1, 120, 1.0), (0, 150, 2.0), (1, 150, 2.0),
    (3, 60, np.nan), (0, 200, np.nan), (1, 40, np.nan), (2, 1000, 7.0), (2, 1100, np.nan),
    (1, 259, 2.0),
]


def test_steps_by_rank_equals_step_at_rank_by_rank():
    rank, times, expected = (np.array(column) for column in zip(*CROSS_RANK_TIMES))
    found = _steps_by_rank(rank, times, CROSS_RANK_STEPS)
    np.testing.assert_array_equal(found, expected)
    one_by_one = np.full(len(times), np.nan)
    for r in np.unique(rank):
        own = CROSS_RANK_STEPS[CROSS_RANK_STEPS["rank"] == r].sort_values("start_ns")
        if len(own):
            one_by_one[rank == r] = step_at(times[rank == r], own["start_ns"].to_numpy(),
                                            own["end_ns"].to_numpy(),
                                            own["step"].to_numpy(dtype="float64"))
    np.testing.assert_array_equal(found, one_by_one)
    assert np.isnan(_steps_by_rank(rank, times, CROSS_RANK_STEPS.iloc[:0])).all()


def test_step_at_outside_every_step_and_without_steps():
    starts, ends, numbers = np.array([0.0, 100.0]), np.array([50.0, 200.0]), np.array([3.0, 4.0])
    found = step_at(np.array([0.0, 49.0, 50.0, 100.0, 199.0, 200.0, np.nan, -1.0]), starts, ends,
                    numbers)
    np.testing.assert_array_equal(found, [3.0, 3.0, np.nan, 4.0, 4.0, np.nan, np.nan, np.nan])
    assert np.isnan(step_at(np.array([1.0, 2.0]), np.zeros(0), np.zeros(0), np.zeros(0))).all()
