"""Ops timed at issue only (comm records with `timing` "issue": no completion, as gloo's Flight
Recorder gives them) against answers worked out by hand: arrival from issue and the queue's
previous op, wait not clipped by an unknown end, transfer unknown (never 0 GB/s); and records
written out of issue order matched by issue time (docs/cross-rank.md)."""

import math

import numpy as np
import pandas as pd

from analysis.crossrank import analyse
from analysis.crossrank.run_frames import ops_from_records
from helpers.crossrank_ops import MS, frame, issue_only, op, steps_frame

# The ranks' clocks measured equal: the waits below are read on one clock as written.
NO_SYNC = pd.DataFrame({"rank": [0, 1], "offset_ns": [0, 0], "uncertainty_ns": [1_000, 1_000]})


def _three_buckets(late_ms=25):
    """Rank 0 issues three bucket all-reduces at 0, 1, 2 ms of step 1; rank 1 the same ones
    `late_ms` later; all timed at issue only."""
    rows = []
    for k in range(3):
        rows.append(issue_only(0, (100 + k) * MS, step=1))
        rows.append(issue_only(1, (100 + late_ms + k) * MS, step=1))
    return frame(rows)


def test_issue_only_waits_follow_the_late_rank_once_not_once_per_bucket():
    result = analyse(_three_buckets(), steps_frame([0, 1], [1]), NO_SYNC, 2)
    assert result.clock.set_index("rank").loc[1, "offset_ns"] == 0
    ops = result.ops.sort_values(["rank", "issue_ns"])
    mine = ops[ops["rank"] == 0]
    # Bucket 0 waits 100 -> 125 ms; bucket 1 cannot start before bucket 0's last arrival
    # (125 ms): it arrives at 125 and waits until 126; bucket 2: 126 -> 127.
    assert (mine["arrival_ns"] // MS).tolist() == [100, 125, 126]
    assert (mine["wait_ns"] / MS).tolist() == [25.0, 1.0, 1.0]
    assert ops.loc[ops["rank"] == 1, "wait_ns"].tolist() == [0, 0, 0]
    assert (ops["transfer_ns"] == 0).all() and not ops["timed"].any()
    waits = result.waits.set_index("rank")
    assert waits.loc[0, "wait_for_peers_ms"] == 27.0  # not 3 x 25
    assert math.isnan(waits.loc[0, "transfer_ms"]) and math.isnan(waits.loc[1, "transfer_ms"])
    # Unknown transfer is left out of bandwidth, never counted as 0 GB/s.
    assert result.bandwidth.empty
    assert ops["transfer_algbw_gbps"].isna().all()


def test_without_clock_sync_issue_times_place_no_clock_and_name_no_straggler():
    # Issue-only ops have no completion: their issue times are never read as a clock offset
    # (which would hide a late rank), and without clock_sync rank 1's clock is not known. Who
    # waited cannot be told, so no wait is given (NaN, not 0) and no rank is named late, in a
    # run long enough to name rank 1 if its clock were known; a note says why.
    rows = []
    for s in range(1, 13):
        for k in range(2):
            rows += [issue_only(0, (s * 100 + k) * MS, step=s),
                     issue_only(1, (s * 100 + 25 + k) * MS, step=s)]
    steps = steps_frame([0, 1], range(1, 13))
    named = analyse(frame(rows), steps, NO_SYNC, 2)
    assert named.stragglers.set_index("rank").loc[1, "fires"]  # on one clock: named
    result = analyse(frame(rows), steps, NO_SYNC.iloc[:0], 2)
    clock = result.clock.set_index("rank")
    assert (clock.loc[1, "source"], clock.loc[1, "offset_ns"]) == ("none", 0)
    assert result.ops.empty and result.stragglers.empty
    assert result.waits[["wait_for_peers_ms", "transfer_ms", "queued_ms"]].isna().all().all()
    assert len(result.waits) == 24
    (note,) = result.notes
    assert note.note and note.name == "clock of rank(s) 1 unknown"
    assert "in the 12 step(s)" in note.evidence


def test_an_issue_only_wait_is_not_clipped_by_its_unknown_end():
    # A timed op's wait is clipped to its own end; an issue-only op's end says nothing. (Rank
    # 0's timed op ends 8 ms before rank 1 issued: a clock error, which a clock_sync vouching
    # for 10 ms allows.)
    timed = frame([op(0, 0, 2 * MS, step=1), op(1, 10 * MS, 11 * MS, step=1)])
    untimed = frame([issue_only(0, 0, step=1), issue_only(1, 10 * MS, step=1)])
    loose = NO_SYNC.assign(uncertainty_ns=10 * MS)
    clipped = analyse(timed, steps_frame([0, 1], [1]), loose, 2).ops
    whole = analyse(untimed, steps_frame([0, 1], [1]), NO_SYNC, 2).ops
    assert clipped.loc[clipped["rank"] == 0, "wait_ns"].item() == 2 * MS
    assert whole.loc[whole["rank"] == 0, "wait_ns"].item() == 10 * MS


def test_a_timed_op_keeps_its_transfer_beside_issue_only_ones():
    rows = [op(0, 0, 6 * MS, step=1), op(1, 4 * MS, 6 * MS, step=1),
            issue_only(0, 10 * MS, step=1), issue_only(1, 13 * MS, step=1)]
    result = analyse(frame(rows), steps_frame([0, 1], [1]), NO_SYNC, 2)
    waits = result.waits.set_index("rank")
    assert waits.loc[0, "wait_for_peers_ms"] == 4.0 + 3.0
    assert waits.loc[0, "transfer_ms"] == 2.0 and waits.loc[1, "transfer_ms"] == 2.0
    assert result.bandwidth["count"].tolist() == [2]


def _records(rank, rows):
    """Comm records (tracer.schema.CommRecord columns) of one rank, in file order."""
    return pd.DataFrame([{"step": s, "op": "all_reduce", "source": source, "pg": "0",
                          "pg_size": 2, "dtype": "float32", "bytes": nbytes, "start_ns": t,
                          "end_ns": t if timing == "issue" else t + MS,
                          "duration_us": 0.0 if timing == "issue" else 1000.0,
                          "timing": timing, "rank": rank}
                         for s, source, nbytes, t, timing in rows])


def test_records_written_late_are_matched_in_issue_order():
    # Each rank issued a 4 KiB hook all-reduce, then a native 8 KiB one; rank 1 wrote the
    # native record first (off the main thread). Matching by file order would pair 4 KiB
    # with 8 KiB: a mismatch.
    rank0 = _records(0, [(1, "c10d", 4096, 10 * MS, "host"), (1, "native", 8192, 20 * MS,
                                                                 "issue")])
    rank1 = _records(1, [(1, "native", 8192, 21 * MS, "issue"),
                         (1, "c10d", 4096, 11 * MS, "host")])
    ops = pd.concat([ops_from_records(rank0, 0), ops_from_records(rank1, 1)],
                    ignore_index=True)
    assert ops["timed"].tolist() == [True, False, True, False]
    result = analyse(ops, steps_frame([0, 1], [1]), NO_SYNC, 2)
    assert result.mismatches.empty
    matched = result.ops.groupby("instance")["bytes"].agg(lambda b: sorted(set(b)))
    assert sorted(map(tuple, matched)) == [(4096.0,), (8192.0,)]


def test_records_from_before_the_first_step_are_not_ops():
    records = _records(0, [(0, "c10d", 4096, 1 * MS, "host"), (1, "native", 4096, 2 * MS,
                                                                "issue")])
    ops = ops_from_records(records, 0)
    assert ops["step"].tolist() == [1] and np.array_equal(ops["timed"], [False])
