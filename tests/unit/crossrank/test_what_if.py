"""What-if answers (analysis.crossrank.what_if) on hand-built runs whose savings are computed by
hand (docs/critical-path.md): the graph's nodes shortened and every step propagated again."""

import numpy as np
import pandas as pd
import pytest

from analysis.core import dag
from analysis.crossrank import analyse as cross_rank_pass
from analysis.crossrank import critical_path, step_graph, what_if
from helpers.crossrank_ops import MS, frame, op

STEP = 100 * MS


def run(rows, ends: dict, steps, world_size, busbw_gbps=None):
    """The what-if answers of ops `rows`, every rank's step s running from s * STEP to
    s * STEP + ends[rank] ms, every clock offset 0."""
    stepped = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                             "end_ns": s * STEP + ends[r] * MS} for s in steps for r in ends])
    offsets = pd.DataFrame({"rank": range(world_size), "offset_ns": 0, "uncertainty_ns": 0})
    cross = cross_rank_pass(frame(rows), stepped, offsets, world_size)
    answers = critical_path.analyse(cross, stepped, busbw_gbps=busbw_gbps).what_if
    return {a["change"]: a for a in answers}, answers


def late_rank(steps=(1, 2, 3, 4), late_ms=25):
    """Rank 0 works 10 ms, rank 1 10 + late_ms, before one all_reduce per step (2 ms after both
    arrived); step ends 3 ms (rank 0) and 4 ms (rank 1) after it."""
    rows = []
    for s in steps:
        base, end = s * STEP, s * STEP + (12 + late_ms) * MS
        rows += [op(0, base + 10 * MS, end, step=s), op(1, base + (10 + late_ms) * MS, end, step=s)]
    return rows, {0: 15 + late_ms, 1: 16 + late_ms}, steps


def test_the_late_rank_on_time_saves_its_lateness_every_step():
    by_change, answers = run(*late_rank(), world_size=2)
    on_time = by_change["rank 1 on time"]
    assert on_time["kind"] == "rank_on_time" and on_time["ranks"] == [1]
    # Step 1: its 25 ms late, and its 4 ms after the op at rank 0's 3: both end at 15 ms, not
    # 41 (26 saved). Each later step starts that much earlier (the chained graph keeps each
    # rank's 59 and 60 ms between steps) and saves its own 25: rank 0, starting 1 ms later,
    # is then the last to arrive.
    assert on_time["saved_ms_per_step"] == (26 + 25 + 25 + 25) / 4
    # measured: (40 + 41) / 2 ms per step
    assert on_time["predicted_step_ms"] == 40.5 - 25.25
    assert answers[0] is on_time  # largest saving first
    assert "rank 0 on time" not in by_change  # rank 0 made no one wait


def test_an_overlapped_transfer_saves_it_and_a_faster_link_saves_part_of_it():
    # 4096 B all_reduce over 2 ranks: bus factor 1, so 0.004096 GB/s takes 1 ms (of 2)
    by_change, answers = run(*late_rank(), world_size=2, busbw_gbps=0.004096)
    group = "all_reduce on group 0 (4-8 KiB)"
    overlapped = by_change[f"{group} transfer overlapped"]
    assert overlapped["saved_ms_per_step"] == 2.0 and overlapped["ranks"] == [0, 1]
    assert overlapped["predicted_step_ms"] == 38.5
    faster = by_change[f"{group} at 0.004096 GB/s busbw"]
    assert faster["kind"] == "transfer_at_busbw" and faster["saved_ms_per_step"] == 1.0
    assert [a["saved_ms_per_step"] for a in answers] == [25.25, 2.0, 1.0]
    assert all(list(a) == what_if.WHAT_IF_KEYS for a in answers)


def test_a_bus_bandwidth_slower_than_measured_saves_nothing():
    by_change, _ = run(*late_rank(), world_size=2, busbw_gbps=0.001)  # 4.1 ms > 2 ms
    assert by_change["all_reduce on group 0 (4-8 KiB) at 0.001 GB/s busbw"][
        "saved_ms_per_step"] == 0.0


def test_a_rank_late_only_because_it_waited_is_not_an_answer_the_first_rank_is():
    # rank 2 late before its all_reduce with rank 1 (group a); rank 1 then 3 ms of work and an
    # all_reduce with rank 0 (group b); rank 0 ends last at 39 ms
    rows = [op(1, 5 * MS, 32 * MS, step=1, pg="a"), op(2, 30 * MS, 32 * MS, step=1, pg="a"),
            op(0, 8 * MS, 37 * MS, step=1, pg="b"), op(1, 35 * MS, 37 * MS, step=1, pg="b")]
    rows = [{**r, "issue_ns": r["issue_ns"] + STEP, "end_ns": r["end_ns"] + STEP} for r in rows]
    by_change, _ = run(rows, {0: 39, 1: 38, 2: 33}, [1], world_size=3)
    # rank 2's 30 ms set to rank 1's 5: a ends at 7, b's last arrival 10, rank 0 ends at 14
    assert by_change["rank 2 on time"]["saved_ms_per_step"] == 25.0
    # rank 1 worked less than its peers before both its ops: nothing of its to shorten
    assert "rank 1 on time" not in by_change


def test_the_median_of_the_other_members_sets_the_late_ranks_work():
    # four ranks work 10, 12, 20 and 40 ms before one all_reduce (2 ms): rank 3 on time works
    # the median of 10, 12 and 20, 12 ms, and the last arrival becomes rank 2's at 20 ms; its
    # 2 ms after the op become the others' 1: every rank ends at 23 ms, not 44
    rows = [op(r, w * MS + STEP, 42 * MS + STEP, step=1, size=4)
            for r, w in enumerate((10, 12, 20, 40))]
    by_change, _ = run(rows, {0: 43, 1: 43, 2: 43, 3: 44}, [1], world_size=4)
    assert by_change["rank 3 on time"]["saved_ms_per_step"] == 21.0
    assert by_change["rank 3 on time"]["predicted_step_ms"] == 43.25 - 21.0
    # only the last arriver made the others wait: no other rank is asked about
    assert [name for name in by_change if name.endswith("on time")] == ["rank 3 on time"]


def test_the_saving_is_the_mean_over_steps_of_the_latest_step_end():
    rows, ends, _ = late_rank(steps=(1,), late_ms=25)
    more, ends2, _ = late_rank(steps=(2,), late_ms=5)  # rank 1 only 5 ms late in step 2
    stepped_rows = rows + more
    stepped = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                             "end_ns": s * STEP + e[r] * MS}
                            for s, e in ((1, ends), (2, ends2)) for r in e])
    offsets = pd.DataFrame({"rank": [0, 1], "offset_ns": 0, "uncertainty_ns": 0})
    cross = cross_rank_pass(frame(stepped_rows), stepped, offsets, 2)
    answers = critical_path.analyse(cross, stepped).what_if
    on_time = next(a for a in answers if a["change"] == "rank 1 on time")
    # step 1 saves 25 + 1 (its 4 ms after the op at rank 0's 3); step 2 starts 26 ms earlier
    # and saves its own 5, its last ms taken by rank 0, which starts 1 ms after rank 1
    assert on_time["saved_ms_per_step"] == pytest.approx((26 + 5) / 2)


def test_every_change_is_propagated_in_one_pass_per_column():
    rows, ends, steps = late_rank(steps=(1, 2))
    stepped = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                             "end_ns": s * STEP + ends[r] * MS} for s in steps for r in ends])
    offsets = pd.DataFrame({"rank": [0, 1], "offset_ns": 0, "uncertainty_ns": 0})
    cross = cross_rank_pass(frame(rows), stepped, offsets, 2)
    graph = step_graph.build(cross.ops, stepped)
    shortened = what_if.rank_on_time(graph, 1, graph.duration)
    both = dag.propagate(graph, np.column_stack([graph.duration, shortened]))
    alone = dag.propagate(graph, shortened)
    assert np.array_equal(both[:, 1], alone[:, 0])
    assert what_if.step_ends(graph, both).tolist() == [[STEP + 41 * MS, STEP + 15 * MS],
                                                       [2 * STEP + 41 * MS, 2 * STEP + 15 * MS]]


# ---- the order of the answers ----------------------------------------------------------------
def _answer(change: str, kind: str, ranks: list[int], saved: float) -> dict:
    return {"change": change, "kind": kind, "ranks": ranks, "saved_ms_per_step": saved,
            "predicted_step_ms": 100.0 - saved, "assumptions": ""}


def test_a_cause_that_saves_what_rank_on_time_saves_is_told_first():
    """Removing rank 1's loading gaps saves what "rank 1 on time" saves (within 2%): the cause
    says what to change, so it comes first; a cause of another rank, or one saving less, does
    not move, and neither does a larger saving."""
    rows = [_answer("rank 1 on time", "rank_on_time", [1], 60.31),
            _answer("no data loading gaps on rank 1", "idle_cause_removed", [1], 60.29),
            _answer("no data loading gaps on rank 0", "idle_cause_removed", [0], 60.0),
            _answer("all_reduce transfer overlapped", "transfer_overlapped", [0, 1], 3.0)]
    assert [a["change"] for a in what_if.ordered(rows)] == [
        "no data loading gaps on rank 1", "rank 1 on time", "no data loading gaps on rank 0",
        "all_reduce transfer overlapped"]
    less = [rows[0], _answer("no data loading gaps on rank 1", "idle_cause_removed", [1], 58.0)]
    assert [a["change"] for a in what_if.ordered(less)] == [
        "rank 1 on time", "no data loading gaps on rank 1"]
    two_ranks = [rows[0], _answer("rank 0 on time", "rank_on_time", [0], 60.3)]
    assert [a["change"] for a in what_if.ordered(two_ranks)] == [
        "rank 1 on time", "rank 0 on time"]


def test_a_change_on_fewer_ranks_that_saves_as_much_is_told_first():
    """Rank 0's loading gaps hold nobody: removing every rank's saves what removing rank 1's
    saves, and "on rank 1" says where; both before "rank 1 on time"."""
    rows = [_answer("no data loading gaps on any rank", "idle_cause_removed", [0, 1], 60.33),
            _answer("rank 1 on time", "rank_on_time", [1], 60.31),
            _answer("no data loading gaps on rank 1", "idle_cause_removed", [1], 60.29)]
    assert [a["change"] for a in what_if.ordered(rows)] == [
        "no data loading gaps on rank 1", "no data loading gaps on any rank", "rank 1 on time"]
    more = [_answer("no data loading gaps on any rank", "idle_cause_removed", [0, 1], 70.0),
            rows[2]]
    assert [a["change"] for a in what_if.ordered(more)] == [
        "no data loading gaps on any rank", "no data loading gaps on rank 1"]
