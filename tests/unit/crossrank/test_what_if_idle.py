"""Idle gaps of one cause removed (analysis.crossrank.what_if_idle) on hand-built runs whose
savings are computed by hand (docs/critical-path.md, "Idle gaps of one cause removed")."""

import pandas as pd

from analysis.crossrank import analyse as cross_rank_pass
from analysis.crossrank import critical_path, what_if_idle
from helpers.crossrank_ops import MS, frame, op

STEP = 100 * MS
STEPS = (1, 2, 3, 4)


def late_rank():
    """Rank 0 works 10 ms, rank 1 35 ms before one all_reduce per step (2 ms after both
    arrived); the step ends 3 ms (rank 0) and 4 ms (rank 1) after it."""
    rows = []
    for s in STEPS:
        base = s * STEP
        rows += [op(0, base + 10 * MS, base + 37 * MS, step=s),
                 op(1, base + 35 * MS, base + 37 * MS, step=s)]
    steps = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                           "end_ns": s * STEP + e * MS} for s in STEPS for r, e in ((0, 40),
                                                                                   (1, 41))])
    offsets = pd.DataFrame({"rank": [0, 1], "offset_ns": 0, "uncertainty_ns": 0})
    return cross_rank_pass(frame(rows), steps, offsets, 2), steps


def gap(rank, step, start_ms, end_ms, cause="data_loading"):
    return {"rank": rank, "step": step, "start_ns": step * STEP + start_ms * MS,
            "end_ns": step * STEP + end_ms * MS, "dur_ns": (end_ms - start_ms) * MS,
            "host_activity": cause}


def answers(gaps, profiled=None):
    cross, steps = late_rank()
    result = critical_path.analyse(cross, steps, idle_gaps=pd.DataFrame(gaps),
                                   profiled=profiled)
    return {a["change"]: a for a in result.what_if}


def test_the_late_ranks_loading_removed_saves_it_measured_in_the_profiled_steps_only():
    # rank 1 loads data 25 ms before its op in steps 2 and 3, the profiled ones
    profiled = pd.DataFrame({"rank": [0, 1, 0, 1], "step": [2, 2, 3, 3]})
    found = answers([gap(1, s, 2, 27) for s in (2, 3)], profiled)
    removed = found["no data loading gaps on rank 1"]
    assert removed["kind"] == "idle_cause_removed" and removed["ranks"] == [1]
    # its 35 ms of work before the op become 10: the op ends 25 ms earlier, every step ends
    # at 16 ms (rank 1) instead of 41; the 2 profiled steps' saving stands for all 4 steps
    assert removed["saved_ms_per_step"] == 25.0
    assert removed["predicted_step_ms"] == 40.5 - 25.0
    assert "2 profiled step(s)" in removed["assumptions"]
    assert "no data loading gaps on any rank" not in found  # only rank 1 has such gaps


def test_a_gap_after_the_op_saves_only_until_the_other_rank_ends_the_step():
    # 3 ms of synchronisation in rank 1's 4 ms after its op: rank 1 ends step 1 at 38, rank 0
    # at 40 (1 ms saved); rank 1, the late one, starts each later step 3 ms earlier, and the
    # whole step moves with it (3 ms each)
    found = answers([gap(1, s, 38, 41, "synchronisation") for s in STEPS])
    assert found["no synchronisation gaps on rank 1"]["saved_ms_per_step"] == (1 + 3 + 3 + 3) / 4


def test_every_ranks_gaps_at_once_and_each_ranks_beyond_the_others():
    # rank 0 loads 5 ms before its op, rank 1 25 ms. Alone, a rank's gaps go down to the other
    # ranks' median, the loading every rank does: rank 0's none (it has less, and it waited),
    # rank 1's 20 of its 25 ms (its op issued at 15, the step ending at 21 instead of 41);
    # all at once, every gap: as much as rank 1's 25 ms
    found = answers([g for s in STEPS for g in (gap(0, s, 0, 5), gap(1, s, 5, 30))])
    assert found["no data loading gaps on rank 0"]["saved_ms_per_step"] == 0.0
    alone = found["no data loading gaps on rank 1"]
    assert alone["saved_ms_per_step"] == 20.0
    assert "on rank 1 beyond the other ranks' median in the same step" in alone["assumptions"]
    both = found["no data loading gaps on any rank"]
    assert both["ranks"] == [0, 1] and both["saved_ms_per_step"] == 25.0
    assert "beyond" not in both["assumptions"]


def test_a_rank_with_the_others_gaps_saves_nothing_alone_and_the_others_median_counts():
    # ranks 0 and 2 load 4 and 6 ms, rank 1 20 ms in step 1 and 5 in the others: rank 1's
    # gaps beyond the median (5 ms) go, 15 ms in step 1 only
    ranks = (0, 1, 2)
    rows = [op(r, s * STEP + w * MS, s * STEP + 32 * MS, step=s, size=3)
            for s in STEPS for r, w in ((0, 10), (1, 30 if s == 1 else 15), (2, 12))]
    steps = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                           "end_ns": s * STEP + 34 * MS} for s in STEPS for r in ranks])
    offsets = pd.DataFrame({"rank": list(ranks), "offset_ns": 0, "uncertainty_ns": 0})
    cross = cross_rank_pass(frame(rows), steps, offsets, 3)
    gaps = ([gap(0, s, 0, 4) for s in STEPS] + [gap(2, s, 0, 6) for s in STEPS]
            + [gap(1, s, 0, 20 if s == 1 else 5) for s in STEPS])
    found = {a["change"]: a for a in critical_path.analyse(
        cross, steps, idle_gaps=pd.DataFrame(gaps)).what_if}
    # step 1: rank 1 issues at 15 instead of 30 (after rank 2's 12): its op ends 15 ms
    # earlier; in the other steps rank 1 has the median's gaps and nothing changes
    assert found["no data loading gaps on rank 1"]["saved_ms_per_step"] == 15.0 / 4


def test_only_the_part_of_a_gap_inside_the_host_work_is_taken_out():
    # a gap from 30 to 38 ms: 5 ms inside rank 1's work before its op (to 35), 2 ms in the
    # transfer (35-37, no host work), 1 ms in the work after it (37-41)
    found = answers([gap(1, s, 30, 38) for s in STEPS])
    # the op ends 5 ms earlier (32); rank 1 ends 32 + 3 = 35, rank 0 at 35: 6 ms saved of 41
    assert found["no data loading gaps on rank 1"]["saved_ms_per_step"] == 6.0


def test_waits_for_peers_and_gaps_of_no_cause_are_not_asked_about():
    found = answers([gap(0, s, 11, 35, "waiting_for_peers") for s in STEPS]
                    + [gap(1, s, 2, 10, "other") for s in STEPS])
    assert not [name for name in found if name.startswith("no ")]


def test_gaps_move_from_the_kineto_clock_to_the_common_clock():
    gaps = pd.DataFrame([gap(1, 1, 2, 27)])
    clock = pd.DataFrame({"rank": [0, 1], "offset_ns": [0, 7 * MS], "drift_ns_per_s": 0.0})
    moved = what_if_idle.gaps_on_common_clock(gaps, clock, {1: 3 * MS})
    # Kineto 3 ms ahead of the ops' clock, which reads 7 ms ahead of the common one
    assert moved[["start_ns", "end_ns"]].values.tolist() == [[STEP - 8 * MS, STEP + 17 * MS]]
    assert what_if_idle.gaps_on_common_clock(None, clock).empty


def test_no_answer_where_no_profiled_step_is_analysed_and_the_gaps_steps_by_default():
    found = answers([gap(1, s, 2, 27) for s in STEPS], pd.DataFrame({"rank": [1], "step": [9]}))
    assert "no data loading gaps on rank 1" not in found
    # without `profiled`, the steps the gaps have are the known ones
    by_default = answers([gap(1, 2, 2, 27)])["no data loading gaps on rank 1"]
    assert by_default["saved_ms_per_step"] == 25.0 and "1 profiled step(s)" in by_default[
        "assumptions"]
