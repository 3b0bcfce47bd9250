"""Waits per op and per step (analysis.crossrank.waits) against hand-computed answers on small
built frames: runs in which no op matched (a lone rank's trace) get typed empty tables and zero
waits per step through the same path as any run, arrivals stay exact at epoch times, and the
group helpers (analysis.crossrank.grouped) they are computed with."""

import numpy as np
import pandas as pd

from analysis.crossrank import analyse
from analysis.crossrank.clock import clock_table, estimate_offsets
from analysis.crossrank.grouped import cummax_by_group, group_starts, union_lengths
from analysis.crossrank.matching import match_ops
from analysis.crossrank.run_frames import typed_ops
from analysis.crossrank.waits import WAITS_COLUMNS, op_waits, rank_step_waits

NO_CLOCK_SYNC = pd.DataFrame(columns=["rank", "offset_ns", "uncertainty_ns"])
WAIT_COLUMNS = ["arrival_ns", "last_arrival_ns", "last_rank", "wait_ns", "transfer_ns",
                "queued_ns"]


def op(rank, issue, step=0, pg="0", size=2, name="all_reduce", end=None, queue=None):
    return {"rank": rank, "pg": pg, "pg_size": size, "op": name, "bytes": 4096.0,
            "dtype": "float32", "step": step, "issue_ns": issue,
            "end_ns": issue + 5 if end is None else end, "peer": np.nan, "queue": queue or pg}


def steps_of(pairs):
    return pd.DataFrame({"rank": [r for r, _ in pairs], "step": [s for _, s in pairs],
                         "start_ns": [0] * len(pairs), "end_ns": [100] * len(pairs)})


# ---- no op matched -------------------------------------------------------------------------------
def test_a_lone_rank_gets_typed_empty_tables_and_zero_waits():
    # rank 1 of a world of 2: every op waits for rank 0, which is absent
    ops = typed_ops(pd.DataFrame([op(1, 10, 0), op(1, 30, 0), op(1, 50, 1)]))
    steps = steps_of([(1, 1), (1, 0), (1, 1)])  # unsorted, with a repeat
    result = analyse(ops, steps, NO_CLOCK_SYNC, 2)
    table = result.ops
    assert table.empty and isinstance(table.index, pd.RangeIndex)
    added = ["position", "instance", *WAIT_COLUMNS, "transfer_algbw_gbps",
             "transfer_busbw_gbps"]
    assert list(table.columns) == list(ops.columns) + added
    assert [str(table[c].dtype) for c in added] == ["int64"] * 8 + ["float64"] * 2
    waits = result.waits
    assert waits.to_dict("list") == {"rank": [1, 1], "step": [0, 1],
                                     "wait_for_peers_ms": [0.0, 0.0],
                                     "transfer_ms": [0.0, 0.0], "queued_ms": [0.0, 0.0],
                                     "ops": [0, 0]}
    assert list(waits.dtypes.astype(str)) == ["int64"] * 2 + ["float64"] * 3 + ["int64"]
    for name in ("bandwidth", "stragglers", "pipeline"):
        assert getattr(result, name).empty and len(getattr(result, name).columns) > 3, name
    assert list(result.clock["rank"]) == [0, 1]
    assert list(result.clock["source"]) == ["reference", "none"]


def test_nothing_matched_gives_no_waits_and_zeros_in_every_step():
    lone = typed_ops(pd.DataFrame([op(1, 0, step=4), op(1, 10, step=2)]))
    lone["position"], lone["instance"] = 0, -1
    waits = op_waits(lone)
    assert waits.empty and list(waits.columns) == list(lone.columns) + WAIT_COLUMNS
    assert (waits.dtypes.iloc[-6:] == "int64").all()
    steps = pd.DataFrame({"rank": [1, 1, 0, 1, 2, 0], "step": [4, 2, 3, 2, 3, 1]})
    table = rank_step_waits(waits, steps)
    assert list(table.columns) == WAITS_COLUMNS
    assert table.to_dict("list") == {"rank": [0, 0, 1, 1, 2], "step": [1, 3, 2, 4, 3],
                                     "wait_for_peers_ms": [0.0] * 5, "transfer_ms": [0.0] * 5,
                                     "queued_ms": [0.0] * 5, "ops": [0] * 5}
    assert table["ops"].dtype == "int64" and table["queued_ms"].dtype == "float64"
    assert rank_step_waits(waits).empty and list(rank_step_waits(waits).columns) == WAITS_COLUMNS


def test_no_matched_synchronising_collective_leaves_the_clock_unestimated():
    # a broadcast does not synchronise; an all_reduce issued on one rank only is not matched
    rows = [op(0, 0, name="broadcast"), op(1, 10, name="broadcast"), op(0, 20)]
    matched, _ = match_ops(typed_ops(pd.DataFrame(rows)), 2,
                           pd.DataFrame({"rank": [0], "step": [0]}))
    estimate = estimate_offsets(matched)
    assert estimate.empty and list(estimate.columns) == [
        "rank", "offset_ns", "drift", "uncertainty_ns", "instances", "t0", "estimate_from",
        "low_ns", "high_ns"]
    table = clock_table(matched, NO_CLOCK_SYNC, {0, 1})
    assert table["source"].tolist() == ["reference", "none"]
    assert table["offset_ns"].tolist() == [0, 0] and table.attrs["t0"] == 0
    # Rank 1's clock is not known: neither its drift nor its uncertainty is.
    assert table["drift_ns_per_s"].isna().tolist() == [False, True]
    assert table["uncertainty_ns"].isna().tolist() == [False, True]


def test_matched_ops_get_their_waits_and_unmatched_steps_zeros():
    ops = typed_ops(pd.DataFrame([op(0, 10), op(1, 12)]))
    synced = pd.DataFrame({"rank": [1], "offset_ns": [0], "uncertainty_ns": [1_000]})
    result = analyse(ops, steps_of([(0, 0), (1, 0), (1, 3)]), synced, 2)
    # rank 0 arrives at 10 and waits 2 ns for rank 1; both end at their own issue + 5
    assert result.ops[["rank", "wait_ns", "transfer_ns", "last_rank"]].values.tolist() == [
        [0, 2, 3, 1], [1, 0, 5, 1]]
    assert result.waits[["rank", "step", "ops"]].values.tolist() == [[0, 0, 1], [1, 0, 1],
                                                                        [1, 3, 0]]


# ---- exact at epoch times ------------------------------------------------------------------------
EPOCH = 1_796_044_278_676_900_429  # float64 steps by 256 ns here


def test_an_arrival_behind_the_previous_op_is_its_end_to_the_nanosecond():
    # On each rank, the second all-reduce is issued before the first ends on the same queue:
    # it arrives when the first ended, an odd number of ns after the epoch time.
    rows = [op(r, EPOCH + r, end=EPOCH + 1_000_003 + r, queue="s") for r in (0, 1)]
    rows += [op(r, EPOCH + 10 + r, end=EPOCH + 2_000_000 + r, queue="s") for r in (0, 1)]
    matched, _ = match_ops(typed_ops(pd.DataFrame(rows)), 2)
    waits = op_waits(matched).set_index(["rank", "position"])
    assert waits.loc[(0, 1), "arrival_ns"] == EPOCH + 1_000_003
    assert waits.loc[(1, 1), "arrival_ns"] == EPOCH + 1_000_004
    assert waits.loc[(0, 1), "wait_ns"] == 1 and waits.loc[(1, 1), "queued_ns"] == 999_993
    assert waits.loc[(0, 1), "last_rank"] == 1


def test_the_union_of_each_group_keeps_nanoseconds_at_epoch_times():
    # Two intervals 31 ns apart at an epoch time stay apart; overlapping ones count once, an
    # empty one not at all, and a group without intervals gets 0.
    group = np.array([2, 2, 0, 0, 0, 0])
    starts = [EPOCH, EPOCH + 5_002_735, 0, 5, 20, 30]
    ends = [EPOCH + 5_002_704, EPOCH + 7_407_482, 10, 12, 25, 30]
    assert union_lengths(group, 3, starts, ends).tolist() == [17, 0, 5_002_704 + 2_404_747]
    assert union_lengths(np.zeros(0, dtype=np.int64), 2, [], []).tolist() == [0, 0]


def test_running_maxima_start_again_in_each_group():
    values = np.array([EPOCH + 3, EPOCH + 1, EPOCH + 7, 5, 9, 2, EPOCH])
    starts = group_starts(np.array([0, 0, 0, 1, 1, 1, 2]))
    assert starts.tolist() == [True, False, False, True, False, False, True]
    assert cummax_by_group(values, starts).tolist() == [
        EPOCH + 3, EPOCH + 3, EPOCH + 7, 5, 9, 9, EPOCH]
    assert cummax_by_group(values[:0], starts[:0]).tolist() == []


def test_the_waits_are_applied_in_one_step_to_every_table_they_change():
    from analysis.crossrank.waits import with_waits
    from analysis.rank.idle import idle_summary
    from analysis.rank.step_breakdown import rank_totals
    from analysis.run.analysed_run import Run
    from analysis.run.loading import load_run_path
    from helpers.launch import DATA

    run = Run(load_run_path(DATA / "ddp_gloo", use_cache=False), "ddp_gloo", "ddp_gloo")
    profiled, gaps, cross = run._profiled, run._gaps, run.cross_rank
    waited = with_waits(profiled, None, gaps, cross)
    split = waited.per_step
    assert ((split["transfer_ns"] + split["peer_wait_ns"]) == split["comm_only_ns"]).all()
    assert (split["peer_wait_ns"] > 0).any() and waited.analysed is split
    pd.testing.assert_frame_equal(waited.totals, rank_totals(split))
    assert (waited.idle_gaps["host_activity"] == "waiting_for_peers").any()
    pd.testing.assert_frame_equal(waited.idle, idle_summary(waited.idle_gaps))
    # what it was given is left as it was
    assert "peer_wait_ns" not in profiled and not (gaps["host_activity"] ==
                                                   "waiting_for_peers").any()
    # without the pass: the split is unknown and the gaps keep their labels
    alone = with_waits(profiled, None, gaps, None)
    assert alone.per_step["peer_wait_ns"].isna().all() and alone.idle_gaps is gaps
