"""The critical path across ranks (analysis.crossrank.critical_path, step_graph) on hand-built
ops and steps whose paths are known exactly (docs/critical-path.md)."""

import numpy as np
import pandas as pd

from analysis.core import dag
from analysis.core.contracts import CrossRank
from analysis.crossrank import analyse as cross_rank_pass
from analysis.crossrank import critical_path, step_graph
from analysis.report.critical import critical_path_json
from helpers.crossrank_ops import MS, frame, op, steps_frame

STEP = 100 * MS


def zero_offsets(ranks):
    return pd.DataFrame({"rank": list(ranks), "offset_ns": 0, "uncertainty_ns": 0})


def steps_of(ends: dict, steps) -> pd.DataFrame:
    """Every rank's step s from s * STEP to s * STEP + ends[rank] ms."""
    return pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                          "end_ns": s * STEP + ends[r] * MS} for s in steps for r in ends])


def cross(rows, steps, world_size):
    return cross_rank_pass(frame(rows), steps, zero_offsets(range(world_size)), world_size)


def late_rank_run(steps=(1, 2, 3)):
    """Rank 0 computes 10 ms, rank 1 35 ms (25 ms late) before one all_reduce per step that
    lasts 2 ms after both arrived; then 3 ms (rank 0) and 4 ms (rank 1) to the step end."""
    rows = []
    for s in steps:
        base = s * STEP
        rows += [op(0, base + 10 * MS, base + 37 * MS, step=s),
                 op(1, base + 35 * MS, base + 37 * MS, step=s)]
    stepped = steps_of({0: 40, 1: 41}, steps)
    return cross(rows, stepped, 2), stepped


def chain_run():
    """Rank 2 late before an all_reduce with rank 1 (group a); rank 1, which waited 25 ms for
    it, computes 3 ms and all_reduces with rank 0 (group b), which waited 27 ms for rank 1."""
    rows = [op(1, 5 * MS, 32 * MS, step=1, pg="a"), op(2, 30 * MS, 32 * MS, step=1, pg="a"),
            op(0, 8 * MS, 37 * MS, step=1, pg="b"), op(1, 35 * MS, 37 * MS, step=1, pg="b")]
    stepped = steps_of({0: 39, 1: 38, 2: 33}, [1]).assign(
        start_ns=lambda f: f["start_ns"] - STEP, end_ns=lambda f: f["end_ns"] - STEP)
    return cross(rows, stepped, 3), stepped


def pipeline_run():
    """Two stages: stage 0 computes 10 ms and sends its activation (2 ms transfer) to stage 1,
    which waited 9 ms for it in its recv; stage 1 computes 20 ms and sends the gradient back
    (2 ms), for which stage 0 waited 19 ms; stage 0's backward takes 10 ms."""
    rows = [op(0, 10 * MS, 12 * MS, name="send", peer=1),
            op(1, 1 * MS, 12 * MS, name="recv", peer=0),
            op(1, 32 * MS, 34 * MS, name="send", peer=0),
            op(0, 13 * MS, 34 * MS, name="recv", peer=1)]
    stepped = steps_of({0: 44, 1: 35}, [0])
    return cross(rows, stepped, 2), stepped


def path_of(result) -> dict:
    table = result.critical_path
    return {(int(r.rank), r.category): round(r.ms, 6) for r in table.itertuples()}


def test_the_late_ranks_work_is_the_path_and_the_others_wait_is_slack():
    result = critical_path.analyse(*late_rank_run())
    table = result.critical_path
    assert sorted(table["step"].unique()) == [1, 2, 3]
    for step, rows in table.groupby("step"):
        # Steps 2 and 3 begin where the step before ended (rank 1's end, 41 ms into it): the
        # 59 ms to rank 1's next step start are theirs.
        between = {} if step == 1 else {(1, "between_steps"): 59.0}
        assert {(r.rank, r.category): r.ms for r in rows.itertuples()} == {
            (1, "compute"): 39.0, (1, "transfer"): 2.0, **between}
    steps = result.critical_path_steps
    assert steps["path_ms"].tolist() == [41.0, 100.0, 100.0]
    assert steps["end_rank"].tolist() == [1] * 3 and steps["start_rank"].tolist() == [1] * 3


def test_a_chain_of_three_ranks_runs_back_to_the_rank_that_made_both_wait():
    result = critical_path.analyse(*chain_run())
    assert path_of(result) == {(0, "compute"): 2.0, (0, "transfer"): 2.0, (1, "compute"): 3.0,
                               (1, "transfer"): 2.0, (2, "compute"): 30.0}
    summary = result.critical_path_steps.iloc[0]
    assert (summary["path_ms"], summary["end_rank"], summary["start_rank"]) == (39.0, 0, 2)


def test_a_two_stage_pipeline_path_crosses_both_stages_twice_without_the_recv_waits():
    result = critical_path.analyse(*pipeline_run())
    assert path_of(result) == {(0, "compute"): 20.0, (0, "transfer"): 2.0,
                               (1, "compute"): 20.0, (1, "transfer"): 2.0}
    assert result.critical_path_steps["path_ms"].tolist() == [44.0]


def test_measured_durations_propagate_back_to_every_measured_time():
    result, stepped = chain_run()
    graph = step_graph.build(result.ops, step_graph.steps_on_common_clock(
        stepped, result.clock))
    times = dag.propagate(graph, graph.duration)
    assert np.array_equal(times[:, 0], graph.time)
    # S, E per rank, I A F per op, one L per instance
    assert len(graph.time) == 2 * 3 + 3 * 4 + 2
    assert (graph.duration[graph.kind == step_graph.START] == 0).all()


def test_an_op_ending_after_the_next_issue_does_not_hold_that_issue():
    # Rank 0 issues a (group a) at 10 ms and b at 11 ms; a ends at 30 ms, after b's issue: a's
    # end holds rank 0's step end, not its issue of b. Rank 1 issues b at 11 ms, then a at 28.
    rows = [op(0, 10 * MS, 30 * MS, step=1, pg="a"), op(1, 28 * MS, 30 * MS, step=1, pg="a"),
            op(0, 11 * MS, 13 * MS, step=1, pg="b"), op(1, 11 * MS, 13 * MS, step=1, pg="b")]
    stepped = steps_of({0: 32, 1: 31}, [1]).assign(start_ns=0,
                                                   end_ns=lambda f: f["end_ns"] - STEP)
    path = critical_path.analyse(cross(rows, stepped, 2), stepped)
    # E0 (32) <- a's end (2 ms compute) <- a's last arrival, rank 1 at 28 (2 ms transfer)
    # <- rank 1's 15 ms of work after b ended at 13 <- b's transfer on rank 1 (2 ms) <- b's
    # last arrival, both at 11, rank 0 first <- rank 0's 1 ms after issuing a, and 10 before.
    assert path_of(path) == {(0, "compute"): 13.0, (0, "transfer"): 2.0, (1, "compute"): 15.0,
                             (1, "transfer"): 2.0}


def test_the_paths_segments_run_in_time_order_with_one_slice_per_rank_and_category():
    result = critical_path.analyse(*late_rank_run(steps=(1,)))
    segments = result.critical_path_segments
    assert list(segments.columns) == dag.SEGMENT_COLUMNS
    # rank 1: 35 ms of work from its step start at 100 ms, 2 ms transfer, 4 ms to its step end
    assert segments[["rank", "category", "start_ns", "end_ns"]].values.tolist() == [
        [1, "compute", STEP, STEP + 35 * MS], [1, "transfer", STEP + 35 * MS, STEP + 37 * MS],
        [1, "compute", STEP + 37 * MS, STEP + 41 * MS]]


def test_segments_of_two_ranks_join_consecutive_nodes_of_one_rank_and_category():
    result = critical_path.analyse(*chain_run())
    segments = result.critical_path_segments
    # rank 2's 30 ms, the transfer of a on rank 1 (its end is rank 1's), rank 1's 3 ms, the
    # transfer of b on rank 0 and rank 0's 2 ms to its step end
    assert segments[["rank", "category"]].values.tolist() == [
        [2, "compute"], [1, "transfer"], [1, "compute"], [0, "transfer"], [0, "compute"]]
    assert ((segments["end_ns"] - segments["start_ns"]) / MS).tolist() == [30, 2, 3, 2, 2]
    assert (segments["start_ns"].iloc[1:].to_numpy() == segments["end_ns"].iloc[:-1]
            .to_numpy()).all()


def test_the_path_json_lists_each_rank_and_category_per_step():
    result = critical_path.analyse(*late_rank_run(steps=(1,)))
    document = critical_path_json(result)
    [step] = document["critical_path"]
    assert step["by_rank"] == [
        {"rank": 1, "category": "compute", "ms": 39.0},
        {"rank": 1, "category": "transfer", "ms": 2.0}]
    assert [w["change"] for w in document["what_if"]][0] == "rank 1 on time"


def test_no_ops_gives_empty_frames_and_no_answers():
    empty = critical_path.analyse(CrossRank(),
                                  pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns"]))
    assert empty.critical_path.empty and empty.what_if == []
    assert list(empty.critical_path.columns) == dag.PATH_COLUMNS


def test_a_bucket_queued_behind_the_one_before_it_passes_the_path_to_that_ones_end():
    # two all_reduces on one group per rank, the second queued behind the first (arrival at
    # its end, 32 ms); rank 1 issues both 20 ms later than rank 0
    rows = [op(0, 10 * MS, 32 * MS, step=1), op(0, 11 * MS, 34 * MS, step=1),
            op(1, 30 * MS, 32 * MS, step=1), op(1, 31 * MS, 34 * MS, step=1)]
    stepped = steps_of({0: 36, 1: 37}, [1]).assign(start_ns=0,
                                                   end_ns=lambda f: f["end_ns"] - STEP)
    result = cross(rows, stepped, 2)
    assert result.ops["arrival_ns"].tolist() == [10 * MS, 32 * MS, 30 * MS, 32 * MS]
    path = critical_path.analyse(result, stepped)
    # E1 <- 3 ms <- second's transfer (2) <- its last arrival, rank 0's (tie, lowest rank),
    # queued behind the first's end on rank 0 <- the first's transfer on rank 0 (2) <- rank 1's
    # arrival at 30 ms
    assert path_of(path) == {(0, "transfer"): 2.0, (1, "compute"): 33.0, (1, "transfer"): 2.0}
    on_time = {a["change"]: a for a in path.what_if}["rank 1 on time"]
    # its 20 ms late, and its 3 ms after the last op at rank 0's 2
    assert on_time["saved_ms_per_step"] == 21.0


def test_an_end_stamped_before_its_last_arrival_is_negative_clock_time_on_the_path():
    # rank 0's op ends at 29 ms, 1 ms before rank 1 arrived at 30 (clock error, within the 2 ms
    # that clock_sync vouches for: it stands against the op's causality bounds)
    rows = [op(0, 10 * MS, 29 * MS, step=1), op(1, 30 * MS, 32 * MS, step=1)]
    stepped = steps_of({0: 40, 1: 33}, [1]).assign(start_ns=0,
                                                   end_ns=lambda f: f["end_ns"] - STEP)
    sync = zero_offsets(range(2)).assign(uncertainty_ns=[0, 2 * MS])
    path = critical_path.analyse(cross_rank_pass(frame(rows), stepped, sync, 2), stepped)
    assert path_of(path) == {(0, "compute"): 11.0, (0, "clock"): -1.0, (1, "compute"): 30.0}
    assert path.critical_path_steps["path_ms"].tolist() == [40.0]


def test_a_rank_whose_clock_reads_80_ms_ahead_gets_the_same_path_on_the_common_clock():
    (result, stepped), shift = late_rank_run(steps=(1, 2)), 80 * MS
    rows = [op(0, s * STEP + 10 * MS, s * STEP + 37 * MS, step=s) for s in (1, 2)] + [
        op(1, s * STEP + 35 * MS + shift, s * STEP + 37 * MS + shift, step=s) for s in (1, 2)]
    moved_steps = stepped.assign(
        start_ns=stepped["start_ns"] + shift * (stepped["rank"] == 1),
        end_ns=stepped["end_ns"] + shift * (stepped["rank"] == 1))
    sync = pd.DataFrame({"rank": [0, 1], "offset_ns": [0, shift], "uncertainty_ns": [0, 0]})
    moved = critical_path.analyse(cross_rank_pass(frame(rows), moved_steps, sync, 2),
                                  moved_steps)
    same = critical_path.analyse(result, stepped)
    pd.testing.assert_frame_equal(moved.critical_path, same.critical_path)
    assert moved.what_if == same.what_if


def test_a_lone_rank_whose_ops_match_nothing_gives_empty_frames_and_no_answers():
    rows = [op(1, 10 * MS, 12 * MS, step=1), op(1, 20 * MS, 22 * MS, step=2)]
    stepped = steps_of({1: 30}, [1, 2])
    result = critical_path.analyse(cross(rows, stepped, 2), stepped)
    assert result.critical_path.empty and result.critical_path_steps.empty
    assert result.what_if == []


def test_a_steps_path_begins_where_the_previous_steps_path_ended():
    # Rank 0 ends step 1 at 130 ms and starts step 2 at once; rank 1 ends step 1 at 150 ms.
    # In step 2 rank 0 arrives last (165 ms) at an all_reduce that ends at 175 ms. Its path
    # runs back through rank 0's work to its step start (130 ms), but begins at 150 ms, where
    # step 1's path ended: each moment on one step's path.
    rows = [op(0, 120 * MS, 125 * MS, step=1), op(1, 110 * MS, 125 * MS, step=1),
            op(0, 165 * MS, 175 * MS, step=2), op(1, 160 * MS, 175 * MS, step=2)]
    stepped = pd.DataFrame([
        {"rank": 0, "step": 1, "start_ns": 100 * MS, "end_ns": 130 * MS},
        {"rank": 1, "step": 1, "start_ns": 100 * MS, "end_ns": 150 * MS},
        {"rank": 0, "step": 2, "start_ns": 130 * MS, "end_ns": 200 * MS},
        {"rank": 1, "step": 2, "start_ns": 150 * MS, "end_ns": 200 * MS}])
    result = critical_path.analyse(cross(rows, stepped, 2), stepped)
    steps = result.critical_path_steps
    assert steps["path_ms"].tolist() == [50.0, 50.0]
    assert steps["path_ms"].sum() == 100.0  # the elapsed time, 100 to 200 ms
    step_2 = result.critical_path[result.critical_path["step"] == 2]
    assert {(r.rank, r.category): r.ms for r in step_2.itertuples()} == {
        (0, "compute"): 40.0, (0, "transfer"): 10.0}
    segments = result.critical_path_segments
    assert segments.loc[segments["step"] == 2, "start_ns"].min() == 150 * MS


def test_an_op_queued_behind_the_previous_steps_op_waits_for_the_previous_step():
    # Step 1's all_reduce (issued at 30 ms) ends at 130 ms, after the step (0-100 ms); step 2's
    # all_reduce on the same queue, issued at 110 ms, starts only then: its 20 ms in the queue
    # are step 1's work holding step 2, not step 2's own.
    rows = [op(r, 30 * MS, 130 * MS, step=1) for r in (0, 1)]
    rows += [op(r, 110 * MS, 150 * MS, step=2) for r in (0, 1)]
    stepped = steps_frame([0, 1], [1, 2], step_ns=100 * MS).assign(
        start_ns=lambda f: f["start_ns"] - 100 * MS, end_ns=lambda f: f["end_ns"] - 100 * MS)
    result = critical_path.analyse(cross(rows, stepped, 2), stepped)
    step_2 = result.critical_path.query("step == 2").groupby("category")["ms"].sum()
    assert step_2.to_dict() == {"compute": 60.0, "previous_step": 20.0, "transfer": 20.0}
    assert result.critical_path_steps["path_ms"].tolist() == [100.0, 100.0]
