"""Cross-rank matching, clock, waits, culprit and pipeline on hand-built op frames whose answers
are known exactly (docs/cross-rank.md)."""

import pandas as pd
import pytest

from analysis.crossrank import analyse
from analysis.crossrank.clock import clock_table, estimate_offsets, to_common_clock
from analysis.crossrank.matching import match_ops
from analysis.crossrank.pipeline import theory_bubble_pct
from analysis.crossrank.waits import op_waits, transfer_bandwidth
from analysis.report.json_document import cross_rank_json
from helpers.crossrank_ops import MS, NO_SYNC, frame, op, steps_frame, synced


# ---- matching ------------------------------------------------------------------------------------
def test_collectives_match_by_group_order_within_a_step():
    ops = frame([op(r, 10 * r + i, 50 + i, step=s) for s in (0, 1) for r in (0, 1) for i in (0, 1)])
    matched, mismatches = match_ops(ops, world_size=2)
    assert mismatches.empty
    by = matched.groupby("instance")
    assert by.size().tolist() == [2, 2, 2, 2]
    assert (by["position"].nunique() == 1).all() and (by["step"].nunique() == 1).all()


def test_mismatch_names_group_position_and_each_ranks_op():
    ops = frame([
        op(0, 0, 5), op(1, 0, 5), op(2, 0, 5),
        op(0, 10, 15), op(1, 10, 15, nbytes=8192), op(2, 10, 15, name="all_gather"),
        op(0, 20, 25), op(2, 20, 25),  # rank 1 never issues position 2
    ])
    ops["pg_size"] = 3
    matched, mismatches = match_ops(ops, world_size=3)
    rows = mismatches.set_index("position")
    assert list(rows.index) == [1, 2]
    assert rows.loc[1, "problem"] == "members disagree on op, size or dtype"
    assert rows.loc[1, "ranks"] == ("all_gather 4096 B float32 on rank 2; all_reduce 4096 B "
                                    "float32 on rank 0; all_reduce 8192 B float32 on rank 1")
    assert rows.loc[2, "problem"] == "some members never issued it"
    assert rows.loc[2, "missing_ranks"] == "1"
    assert (matched.loc[matched["position"] > 0, "instance"] == -1).all()
    assert (matched.loc[matched["position"] == 0, "instance"] >= 0).all()


def test_an_all_to_all_with_uneven_splits_matches_but_a_dtype_change_does_not():
    ops = frame([op(0, 0, 5, name="all_to_all", nbytes=3072), op(1, 0, 5, name="all_to_all"),
                 op(0, 10, 15, name="all_to_all"),
                 op(1, 10, 15, name="all_to_all", dtype="bfloat16")])
    matched, mismatches = match_ops(ops, world_size=2)
    assert (matched[matched["position"] == 0]["instance"] >= 0).all()
    assert mismatches["position"].tolist() == [1]
    assert mismatches["problem"].tolist() == ["members disagree on op, size or dtype"]


def test_mismatches_between_kineto_traces_alone_say_events_may_have_been_dropped():
    # step 0: rank 1's op is larger; step 1: rank 1 holds one op where ranks 0 and 2 hold two
    ops = frame([op(0, 0, 5), op(1, 0, 5, nbytes=8192), op(2, 0, 5),
                 *[op(r, 100 + 10 * i, 105 + 10 * i, step=1) for r in (0, 2) for i in (0, 1)],
                 op(1, 100, 105, step=1)])
    ops["pg_size"] = 3
    _, traced = match_ops(ops, world_size=3, trace_ranks=frozenset({0, 1, 2}))
    _, mixed = match_ops(ops, world_size=3, trace_ranks=frozenset({0, 1}))
    assert traced.set_index("step")["problem"].to_dict() == {
        0: "the traces disagree on op, size or dtype (dropped events, or a real mismatch)",
        1: "missing from some traces (dropped events, or never issued)"}
    # where a rank with records takes part, the records speak for it: a mismatch of the run
    assert mixed.set_index("step")["problem"].to_dict() == {
        0: "members disagree on op, size or dtype", 1: "some members never issued it"}


def test_p2p_match_by_src_dst_and_order_and_lone_send_is_a_mismatch():
    ops = frame([
        op(0, 0, 5, name="send", peer=1), op(0, 10, 15, name="send", peer=1),
        op(1, 2, 5, name="recv", peer=0), op(1, 3, 15, name="recv", peer=0),
        op(1, 20, 25, name="send", peer=0),  # rank 0 never receives it
    ])
    matched, mismatches = match_ops(ops, world_size=2)
    pairs = matched[matched["instance"] >= 0].groupby("instance")["issue_ns"].apply(sorted)
    assert sorted(pairs.tolist()) == [[0, 2], [3, 10]]
    assert mismatches["problem"].tolist() == ["a send with no matching recv"]
    assert mismatches["missing_ranks"].tolist() == ["0"]


def test_a_send_and_recv_of_different_sizes_is_a_mismatch():
    ops = frame([op(0, 0, 5, name="send", peer=1, nbytes=4096),
                 op(1, 0, 5, name="recv", peer=0, nbytes=8192)])
    matched, mismatches = match_ops(ops, world_size=2)
    assert (matched["instance"] == -1).all()
    assert mismatches.to_dict("records") == [{
        "pg": "0", "step": 0, "position": 0, "problem": "send and recv disagree on size",
        "ranks": "recv 8192 B rank 0 -> rank 1; send 4096 B rank 0 -> rank 1",
        "missing_ranks": ""}]


# ---- clock ---------------------------------------------------------------------------------------
def _collective_run(ranks, instances, offsets, drift_per_s=None, late=None, gap=50 * MS):
    """All-reduces that end together; rank r's clock reads true + offsets[r] (+ drift)."""
    rows = []
    for i in range(instances):
        end = 1_000 * MS + i * gap
        for r in ranks:
            issue = end - 2 * MS - (late or {}).get(r, 0)
            shift = offsets.get(r, 0) + (drift_per_s or {}).get(r, 0) * (end / 1e9)
            rows.append(op(r, issue + shift, end + shift, step=i, size=len(ranks)))
    return frame(rows)


def test_an_80_ms_clock_shift_is_recovered_without_clock_sync():
    ops = _collective_run([0, 1, 2, 3], 30, {2: 80 * MS})
    matched, _ = match_ops(ops, world_size=4)
    clock = clock_table(matched, NO_SYNC, [0, 1, 2, 3]).set_index("rank")
    assert clock.loc[2, "offset_ns"] == 80 * MS
    assert clock.loc[2, "source"] == "collectives"
    assert clock.loc[1, "offset_ns"] == 0 and clock.loc[0, "source"] == "reference"
    common = to_common_clock(matched, clock.reset_index())
    assert common.groupby("instance")["end_ns"].nunique().eq(1).all()


def test_clock_estimate_is_robust_to_outliers_and_reports_disagreement():
    ops = _collective_run([0, 1], 41, {1: 80 * MS})
    ops.loc[(ops["rank"] == 1) & (ops["step"] % 10 == 0), "end_ns"] += 30 * MS  # 5 outliers
    matched, _ = match_ops(ops, world_size=2)
    sync = pd.DataFrame({"rank": [1], "offset_ns": [80 * MS + 300_000], "uncertainty_ns": [5_000]})
    clock = clock_table(matched, sync, [0, 1]).set_index("rank")
    assert clock.loc[1, "estimate_offset_ns"] == 80 * MS
    assert clock.loc[1, "source"] == "clock_sync"
    assert clock.loc[1, "offset_ns"] == 80 * MS + 300_000
    assert clock.loc[1, "disagreement_ns"] == 300_000


def test_clock_drift_is_fitted_on_a_long_run():
    # 400 instances over 200 s; rank 1 drifts 50 us per second from an offset of 5 ms.
    ops = _collective_run([0, 1], 400, {1: 5 * MS}, drift_per_s={1: 50_000}, gap=500 * MS)
    matched, _ = match_ops(ops, world_size=2)
    estimate = estimate_offsets(matched).set_index("rank")
    assert estimate.loc[1, "drift"] * 1e9 == pytest.approx(50_000, rel=1e-6)
    common = to_common_clock(matched, clock_table(matched, NO_SYNC, [0, 1]))
    spread = common.groupby("instance")["end_ns"].agg(lambda e: e.max() - e.min())
    assert spread.max() <= 1_000  # 1 us, against 10 ms of drift over the run


def test_a_late_ranks_late_completions_do_not_bias_its_offset():
    # Rank 1 arrives 30 ms late every step; the op then takes 1 ms, but rank 1, busy computing,
    # sees it complete 1 to 3 ms later (rank 0, blocked waiting, sees it at once). A median of
    # the completion differences would put rank 1's clock 1.8 ms too far; the bracket is
    # [80 - 1, 80 + 1] ms: rank 1's issue - rank 0's end, and the least completion difference.
    lateness = [1.5, 2.5, 1.0, 3.0, 1.2, 2.0, 1.8, 2.2, 1.4, 2.9, 1.6]
    rows = []
    for i, late in enumerate(lateness):
        arrival = 1_000 * MS + i * 100 * MS
        rows += [op(0, arrival - 30 * MS, arrival + MS, step=i),
                 op(1, arrival + 80 * MS, arrival + MS + 80 * MS + int(late * MS), step=i)]
    matched, _ = match_ops(frame(rows), world_size=2)
    clock = clock_table(matched, NO_SYNC, [0, 1]).set_index("rank")
    assert clock.loc[1, "offset_ns"] == 80 * MS
    assert clock.loc[1, "uncertainty_ns"] == MS


def test_offsets_chain_through_groups_without_rank_0():
    rows = []
    for i in range(10):
        end = 1_000 * MS + i * 50 * MS
        rows += [op(0, end - MS, end, step=i, pg="1"),
                 op(1, end - MS + 3 * MS, end + 3 * MS, step=i, pg="1"),
                 op(1, end - MS + 3 * MS, end + 3 * MS, step=i, pg="2"),
                 op(2, end - MS - 7 * MS, end - 7 * MS, step=i, pg="2")]
    matched, _ = match_ops(frame(rows), world_size=3)
    clock = clock_table(matched, NO_SYNC, [0, 1, 2]).set_index("rank")
    assert clock.loc[1, "offset_ns"] == 3 * MS and clock.loc[2, "offset_ns"] == -7 * MS


# ---- waits ---------------------------------------------------------------------------------------
def test_wait_transfer_and_queueing_behind_the_previous_op():
    ops = frame([
        op(0, 0, 12 * MS), op(1, 10 * MS, 12 * MS),  # rank 1 arrives 10 ms late
        op(0, 1 * MS, 15 * MS), op(1, 11 * MS, 15 * MS),  # queued behind the first on both
    ])
    matched, _ = match_ops(ops, world_size=2)
    waits = op_waits(matched).set_index(["rank", "position"])
    first = ["wait_ns", "transfer_ns", "last_rank"]
    assert waits.loc[(0, 0), first].tolist() == [10 * MS, 2 * MS, 1]
    assert waits.loc[(1, 0), ["wait_ns", "transfer_ns"]].tolist() == [0, 2 * MS]
    # Position 1: both arrive when position 0 ends (12 ms): no wait, 3 ms transfer.
    assert waits.loc[(0, 1), ["arrival_ns", "wait_ns", "transfer_ns", "queued_ns"]].tolist() == \
        [12 * MS, 0, 3 * MS, 11 * MS]
    second = ["wait_ns", "transfer_ns", "queued_ns"]
    assert waits.loc[(1, 1), second].tolist() == [0, 3 * MS, 1 * MS]


def test_a_p2p_arrival_is_its_issue_not_the_previous_sends_late_end():
    # Gloo stamps send 1's end (20 ms) when the schedule waits on it; send 2 was issued at 5 ms
    # and rank 1 posted its recv at 6 ms: rank 1 arrived last, rank 0 waited 1 ms.
    ops = frame([
        op(0, 0, 20 * MS, name="send", peer=1), op(0, 5 * MS, 21 * MS, name="send", peer=1),
        op(1, 1 * MS, 2 * MS, name="recv", peer=0), op(1, 6 * MS, 7 * MS, name="recv", peer=0),
    ])
    matched, _ = match_ops(ops, world_size=2)
    waits = op_waits(matched).sort_values("issue_ns").set_index(["rank", "issue_ns"])
    second_send, second_recv = waits.loc[(0, 5 * MS)], waits.loc[(1, 6 * MS)]
    assert [second_send["arrival_ns"], second_send["wait_ns"], second_send["last_rank"]] == \
        [5 * MS, 1 * MS, 1]
    assert [second_recv["arrival_ns"], second_recv["wait_ns"], second_recv["transfer_ns"]] == \
        [6 * MS, 0, 1 * MS]


def test_wait_is_clipped_to_the_ops_own_duration():
    # A broadcast root can finish before the last member arrives: its wait is its duration.
    ops = frame([op(0, 0, 2 * MS, name="broadcast"), op(1, 5 * MS, 6 * MS, name="broadcast")])
    matched, _ = match_ops(ops, world_size=2)
    waits = op_waits(matched).set_index("rank")
    assert waits.loc[0, ["wait_ns", "transfer_ns"]].tolist() == [2 * MS, 0]
    assert waits.loc[1, ["wait_ns", "transfer_ns"]].tolist() == [0, 1 * MS]


def test_per_step_waits_count_overlapping_waits_once():
    # Rank 0 waits in two collectives on two streams at once (two DDP buckets): 10 ms and 8 ms
    # of waiting, both inside [0, 10 ms); rank 1 arrives at 10 ms, both end at 12 ms.
    rows = [op(0, 0, 12 * MS, queue="a"), op(1, 10 * MS, 12 * MS, queue="a"),
            op(0, 2 * MS, 12 * MS, queue="b"), op(1, 10 * MS, 12 * MS, queue="b")]
    # Rank 3 posts two recvs from rank 2 (1 ms apart) before rank 2 sends them at 10 and 11 ms:
    # waits [0, 10) and [1, 11), transfers [10, 11) and [11, 12).
    rows += [op(3, 0, 11 * MS, name="recv", peer=2), op(3, 1 * MS, 12 * MS, name="recv", peer=2),
             op(2, 10 * MS, 11 * MS, name="send", peer=3),
             op(2, 11 * MS, 12 * MS, name="send", peer=3)]
    ops = frame(rows)
    ops.loc[ops["rank"] >= 2, "pg"] = "1"
    synced = pd.DataFrame({"rank": [1, 2, 3], "offset_ns": 0, "uncertainty_ns": 1_000})
    result = analyse(ops, steps_frame(range(4), [0]), synced, 4)
    per_op = result.ops.groupby("rank")[["wait_ns", "transfer_ns"]].sum()
    assert per_op.loc[0].tolist() == [18 * MS, 4 * MS]  # per op: unchanged
    assert per_op.loc[3].tolist() == [20 * MS, 2 * MS]
    waits = result.waits.set_index("rank")
    assert waits.loc[0, ["wait_for_peers_ms", "transfer_ms"]].tolist() == [10.0, 2.0]
    assert waits.loc[1, ["wait_for_peers_ms", "transfer_ms"]].tolist() == [0.0, 2.0]
    assert waits.loc[3, ["wait_for_peers_ms", "transfer_ms"]].tolist() == [11.0, 2.0]
    assert waits.loc[2, ["wait_for_peers_ms", "transfer_ms"]].tolist() == [0.0, 2.0]


def test_transfer_based_bandwidth_uses_the_bus_factor():
    ops = frame([op(r, 0 if r else 8 * MS, 10 * MS, size=4, nbytes=2_000_000) for r in range(4)])
    matched, _ = match_ops(ops, world_size=4)
    table = transfer_bandwidth(op_waits(matched))
    row = table.iloc[0]
    assert row["count"] == 4 and row["transfer_us"] == 4 * 2_000
    assert row["transfer_algbw_gbps"] == pytest.approx(1.0)
    assert row["transfer_busbw_gbps"] == pytest.approx(1.5)  # 2(n-1)/n, n = 4
    assert row["size_bucket"] == "1-2 MiB"


# ---- culprit -------------------------------------------------------------------------------------
def _steady_late_run(late_rank, late_ns, steps=10, ranks=4):
    """The op completes 2 ms after the late rank arrives; the late rank, busy, sees that 2 ms
    later than the others (as on a loaded CPU)."""
    rows = []
    for s in range(steps):
        for r in range(ranks):
            arrive = s * 100 * MS + 50 * MS + (late_ns if r == late_rank else 0)
            seen_late = 2 * MS if r == late_rank else 0
            rows.append(op(r, arrive, s * 100 * MS + 50 * MS + late_ns + 2 * MS + seen_late,
                           step=s, size=ranks))
    return frame(rows)


def test_a_rank_late_every_step_is_named_with_its_caused_wait():
    ops = _steady_late_run(3, 20 * MS)
    result = analyse(ops, steps_frame(range(4), range(10)), NO_SYNC, 4)
    stragglers = cross_rank_json(result)["stragglers"]
    assert [s["rank"] for s in stragglers] == [3]
    assert stragglers[0]["caused_wait_ms_per_step"] == pytest.approx(60.0)  # 3 ranks x 20 ms
    assert stragglers[0]["share_pct"] == pytest.approx(15.0)  # 600 ms of 4 x 1000 ms
    assert stragglers[0]["collectives"][0]["op"] == "all_reduce"
    waits = result.waits.set_index(["rank", "step"])
    assert (waits.loc[0, "wait_for_peers_ms"] == 20.0).all()
    assert (waits.loc[3, "wait_for_peers_ms"] == 0.0).all()


def test_jitter_without_a_steady_culprit_names_no_straggler():
    rows = []
    for s in range(12):
        late = s % 4  # each rank is last in turn, by a few ms
        for r in range(4):
            arrive = s * 100 * MS + (4 * MS if r == late else 0)
            rows.append(op(r, arrive, s * 100 * MS + 6 * MS, step=s, size=4))
    result = analyse(frame(rows), steps_frame(range(4), range(12)), NO_SYNC, 4)
    assert result.stragglers["fires"].sum() == 0
    assert cross_rank_json(result)["stragglers"] == []


def test_a_small_steady_delay_below_the_share_threshold_names_no_straggler():
    synced = pd.DataFrame({"rank": [1, 2, 3], "offset_ns": 0, "uncertainty_ns": 1_000})
    result = analyse(_steady_late_run(1, 1 * MS), steps_frame(range(4), range(10)), synced, 4)
    table = result.stragglers.set_index("rank")
    assert table.loc[1, "share_pct"] == pytest.approx(0.75)
    assert not table.loc[1, "fires"]


def test_a_steady_lateness_shorter_than_the_transfer_names_no_straggler():
    # Rank 0 arrives 2.5 ms after rank 1 in every 20 ms step (12.5% of step time, steady and
    # last in every step), but the all-reduce then takes 6 ms: the wait is within the op's own
    # time.
    rows = []
    for s in range(12):
        arrive = s * 20 * MS + 5 * MS
        rows += [op(0, arrive + 2.5 * MS, arrive + 8.5 * MS, step=s),
                 op(1, arrive, arrive + 8.5 * MS, step=s)]
    synced = pd.DataFrame({"rank": [1], "offset_ns": [0], "uncertainty_ns": [1_000]})
    result = analyse(frame(rows), steps_frame([0, 1], range(12), step_ns=20 * MS), synced, 2)
    row = result.stragglers.set_index("rank").loc[0]
    assert row["share_pct"] == pytest.approx(6.25) and row["steady"] and row["significant"]
    assert not row["material"] and not row["fires"]


def test_the_culprit_survives_an_unsynchronised_clock():
    ops = _steady_late_run(2, 20 * MS)
    ops.loc[ops["rank"] == 2, ["issue_ns", "end_ns"]] += 80 * MS
    result = analyse(ops, steps_frame(range(4), range(10)), NO_SYNC, 4)
    clock = result.clock.set_index("rank")
    assert abs(clock.loc[2, "offset_ns"] - 80 * MS) < MS
    assert [s["rank"] for s in cross_rank_json(result)["stragglers"]] == [2]


# ---- pipeline ------------------------------------------------------------------------------------
def test_pipeline_bubble_split_and_theory():
    # Two stages, 4 microbatches per step; stage 1's recvs each wait 3 ms for stage 0's sends.
    rows = []
    for s in range(2):
        base = s * 100 * MS
        for m in range(4):
            t = base + m * 10 * MS
            rows += [op(0, t + 3 * MS, t + 4 * MS, step=s, name="send", peer=1),
                     op(1, t, t + 4 * MS, step=s, name="recv", peer=0)]
    work = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [0, 1, 0, 1],
                         "step_ns": [100 * MS] * 4,
                         "work_ns": [80 * MS, 80 * MS, 60 * MS, 60 * MS]})
    result = analyse(frame(rows), steps_frame([0, 1], [0, 1]), synced([0, 1]), 2, work=work)
    table = result.pipeline.set_index("rank")
    assert table.loc[1, "measured_bubble_pct"] == pytest.approx(40.0)
    assert table.loc[1, "recv_wait_pct"] == pytest.approx(12.0)  # 4 x 3 ms of 100 ms
    assert table.loc[1, "transfer_pct"] == pytest.approx(4.0)
    assert table.loc[1, "idle_pct"] == pytest.approx(24.0)
    assert table.loc[0, "theory_bubble_pct"] == pytest.approx(20.0)  # (2-1)/(4+2-1)
    assert table["holds_back"].tolist() == [True, False]
    assert cross_rank_json(result)["pipeline"][1] == {
        "rank": 1, "measured_bubble_pct": pytest.approx(40.0), "theory_bubble_pct": 20.0,
        "recv_wait_pct": pytest.approx(12.0)}


def test_theory_bubble_interleaved():
    assert theory_bubble_pct(4, 8) == pytest.approx(100 * 3 / 11)
    assert theory_bubble_pct(4, 8, virtual_stages=2) == pytest.approx(100 * 3 / 19)


def test_json_has_the_documented_keys():
    result = analyse(_steady_late_run(3, 20 * MS), steps_frame(range(4), range(10)), NO_SYNC, 4)
    document = cross_rank_json(result)
    assert set(document) == {"clock", "stragglers", "waits", "mismatches", "pipeline"}
    assert set(document["clock"][0]) >= {"rank", "offset_ns", "uncertainty_ns", "source"}
    assert set(document["waits"][0]) == {"rank", "step", "wait_for_peers_ms", "transfer_ms"}
    assert set(document["stragglers"][0]) == {"rank", "caused_wait_ms_per_step", "share_pct",
                                              "collectives", "evidence"}


def _two_bucket_run(late, steps, gaps=None, step_ns=20 * MS):
    """Two ranks, two all-reduces per step; `late[s]` is (rank, ms) late at both. A step in
    `gaps` starts gaps[step] ms after the previous one ended on rank 1 (the tracer's work)."""
    gaps = gaps or {}
    rows, step_rows = [], []
    for s in range(steps):
        t = s * step_ns
        rank, ms = late[s]
        for bucket in (0, 1):
            at = t + (2 + 6 * bucket) * MS
            rows += [op(r, at + (ms * MS if r == rank else 0), at + ms * MS + 1 * MS, step=s)
                     for r in (0, 1)]
        for r in (0, 1):
            start = t + (gaps.get(s, 0) * MS if r == 1 else 0)
            step_rows.append({"rank": r, "step": s, "start_ns": start, "end_ns": t + step_ns})
    synced = pd.DataFrame({"rank": [1], "offset_ns": [0], "uncertainty_ns": [1_000]})
    return analyse(frame(rows), pd.DataFrame(step_rows), synced, 2)


def test_three_steps_of_noise_name_no_straggler():
    # Rank 0 late in 2 of 3 steps, rank 1 in the other (a profiler window of 3 steps): per step
    # [0, 1.5, 2] ms against rank 0, whose lower quartile is half its median. Three steps are
    # no evidence: a fair draw gives one rank two of three.
    result = _two_bucket_run([(1, 0.5), (0, 1.5), (0, 2.0)], 3)
    assert cross_rank_json(result)["stragglers"] == []
    row = result.stragglers.set_index("rank").loc[0]
    assert row["share_pct"] == pytest.approx(100 * 7 / 120)
    assert row["clean_steps"] == 2 and not row["fires"]


def test_steps_after_the_tracers_own_work_are_left_out():
    # Rank 0 is 4 ms late at both all-reduces of every step but the first (warm-up) and the
    # five after a 10 ms gap of rank 1's tracer (profiler start, window switch, export), where
    # rank 1 is 10 ms late instead: 20 ms of wait, which the gap could explain. A 1 ms gap
    # before step 5 leaves it in: 8 ms of wait are more than twice that.
    gaps = {0: 10, 2: 10, 3: 10, 7: 10, 11: 10, 12: 10, 5: 1}
    late = [(1, 10.0) if gaps.get(s) == 10 else (0, 4.0) for s in range(17)]
    result = _two_bucket_run(late, 17, gaps)
    assert [s["rank"] for s in cross_rank_json(result)["stragglers"]] == [0]
    row = result.stragglers.set_index("rank").loc[0]
    assert (row["clean_steps"], row["top_steps"]) == (11, 11)
    assert row["chance"] == pytest.approx(0.5 ** 11)


def test_a_rank_main_culprit_in_9_of_10_steps_of_two_is_not_named():
    # Chance gives one of two ranks 9 or more of 10 steps with probability 11/1024 each.
    late = [(1, 4.0) if s == 5 else (0, 4.0) for s in range(11)]  # step 0 left out
    result = _two_bucket_run(late, 11)
    assert cross_rank_json(result)["stragglers"] == []
    row = result.stragglers.set_index("rank").loc[0]
    assert row["top_steps"] == 9 and row["chance"] == pytest.approx(11 / 1024)
    assert row["steady"] and row["material"] and not row["significant"] and not row["fires"]


def test_a_completion_the_waiting_member_saw_late_does_not_bound_the_offset():
    # Rank 0 waits 10 ms for rank 1 at every all-reduce; rank 1, busy, sees each completion 1 to
    # 4 ms late. Once rank 0 itself sees the completion 2 ms late (descheduled): that difference
    # lies below the causality bound (79.5 ms) and is no envelope point. Offset 80 ms.
    seen_late = [1.0, 2.0, 3.0, 1.5, 2.5, 4.0, 0.2, 3.5, 1.2, 2.2, 3.1, 1.8]
    rows = []
    for s, late in enumerate(seen_late):
        t = s * 100 * MS
        ref_late = 2 * MS if s == 6 else 0
        rows += [op(0, t, t + 10.5 * MS + ref_late, step=s),
                 op(1, t + 90 * MS, t + 90.5 * MS + late * MS, step=s)]
    result = analyse(frame(rows), steps_frame([0, 1], range(12)), NO_SYNC, 2)
    clock = result.clock.set_index("rank")
    assert abs(clock.loc[1, "offset_ns"] - 80 * MS) < 0.5 * MS
    assert clock.loc[1, "uncertainty_ns"] == pytest.approx(0.75 * MS)  # [79.5, 81] ms


def test_a_change_in_lateness_is_not_fitted_as_clock_drift():
    # 40 instances over 2.6 s (enough to fit a drift): rank 1, last to arrive, sees the
    # completion 1.7 ms late in the first 15 and at once after. A line through that step is
    # over 1 ms per second, beyond what a clock drifts (NTP slews at most 500 us per second):
    # no drift, and the offset stays 80 ms.
    rows = []
    for i in range(40):
        t = 1_000 * MS + i * 65 * MS
        late = 1.7 * MS if i < 15 else 0
        rows += [op(0, t, t + 30.5 * MS, step=i),
                 op(1, t + 30 * MS + 80 * MS, t + 30.5 * MS + 80 * MS + late, step=i)]
    matched, _ = match_ops(frame(rows), world_size=2)
    clock = clock_table(matched, NO_SYNC, [0, 1]).set_index("rank")
    assert clock.loc[1, "drift_ns_per_s"] == 0
    assert abs(clock.loc[1, "offset_ns"] - 80 * MS) < 0.5 * MS


def test_a_rank_late_in_every_one_of_too_few_steps_gets_a_note_not_a_name():
    # Rank 1 is 25 ms late in every step of a 4-step window (3 clean steps): not named, since a
    # fair draw gives one of two ranks 3 of 3 steps a quarter of the time, but noted with the
    # steps it would take: 10 clean steps (0.5 ** 10 < 0.001), 11 traced.
    from analysis.crossrank.culprit import steps_needed
    from analysis.crossrank.findings import too_few_steps
    result = _two_bucket_run([(1, 25.0)] * 4, 4)
    assert cross_rank_json(result)["stragglers"] == []
    row = result.stragglers.set_index("rank").loc[1]
    assert (row["clean_steps"], row["top_steps"], row["too_few_steps"]) == (3, 3, True)
    assert steps_needed(2) == 10 and steps_needed(4) == 5
    (note,) = too_few_steps(result.stragglers, result.ops)
    assert result.notes == (note,) and note.note
    assert note.name == "too few steps to name rank 1 late"
    assert "all 3 clean steps" in note.evidence
    assert "10 clean steps, 11 traced" in note.evidence
    assert "--active 11" in note.suggestion


def test_noise_in_a_short_window_gets_no_note():
    # Rank 0 late in 2 of 3 clean steps, rank 1 in the other: not last in every step, no note.
    from analysis.crossrank.findings import too_few_steps
    result = _two_bucket_run([(1, 0.5), (0, 1.5), (1, 2.0), (0, 2.0)], 4)
    assert not result.stragglers["too_few_steps"].any()
    assert too_few_steps(result.stragglers, result.ops) == [] and result.notes == ()
