"""The pipeline's what-if answers (analysis.crossrank.what_if_pipeline) on hand-built stages
whose propagation is worked out by hand (docs/critical-path.md, "The pipeline's bubble")."""

import dataclasses

import pandas as pd
import pytest

from analysis.crossrank import analyse as cross_rank_pass
from analysis.crossrank import critical_path, step_graph, what_if_pipeline
from helpers.crossrank_ops import MS, frame, op

STEP = 100 * MS
OFFSETS = pd.DataFrame({"rank": [0, 1], "offset_ns": 0, "uncertainty_ns": 0})


def p2p(rank, peer, name, issue, end):
    return op(rank, STEP + issue * MS, STEP + end * MS, step=1, name=name, peer=peer)


def late_second_stage():
    """Two stages, two microbatches (GPipe), stage 1 30 ms late into its step. Stage 0 sends
    activations at 5 and 10 ms, recvs gradients at 11 (waiting until 47) and 53, ends at 60;
    stage 1 recvs the activations at 30 and 36, sends the gradients at 47 and 52, ends at 55.
    Every transfer lasts 1 ms after the later member arrived."""
    rows = [p2p(0, 1, "send", 5, 31), p2p(0, 1, "send", 10, 37),
            p2p(0, 1, "recv", 11, 48), p2p(0, 1, "recv", 53, 54),
            p2p(1, 0, "recv", 30, 31), p2p(1, 0, "recv", 36, 37),
            p2p(1, 0, "send", 47, 48), p2p(1, 0, "send", 52, 54)]
    steps = pd.DataFrame({"rank": [0, 1], "step": 1, "start_ns": STEP,
                          "end_ns": [STEP + 60 * MS, STEP + 55 * MS]})
    return cross_rank_pass(frame(rows), steps, OFFSETS, 2), steps


def answers_of(cross, steps):
    return {a["kind"]: a for a in critical_path.analyse(cross, steps).what_if}


def test_the_schedule_of_two_stages_and_two_microbatches_has_a_third_of_bubble():
    cross, _ = late_second_stage()
    assert cross.pipeline_schedule == {"stages": 2, "microbatches": 2, "virtual_stages": 1,
                                          "theory_bubble_pct": pytest.approx(100 / 3)}


def test_a_stage_waiting_beyond_the_theory_is_charged_to_the_late_stage():
    cross, steps = late_second_stage()
    graph = step_graph.build(cross.ops, steps)
    excess = what_if_pipeline.excess_waits(graph, 1 / 3).set_index("rank")
    # stage 0 waits in its sends [5, 30) and [10, 36) and its first recv [11, 47): 42 ms of its
    # 60; for 42 - x to be a third of 60 - x, x = (42 - 20) / (2 / 3) = 33 ms
    assert excess.loc[0, "wait_ns"] == 42 * MS and excess.loc[0, "excess_ns"] == pytest.approx(
        33 * MS)
    # stage 1 waits 1 ms in its last send (stage 0 arrives at 53): within its third
    assert excess.loc[1, "wait_ns"] == 1 * MS and excess.loc[1, "excess_ns"] == 0
    cuts = what_if_pipeline.stage_cuts(graph, excess.reset_index())
    assert cuts[["rank", "step"]].values.tolist() == [[1, 1]]
    assert cuts["cut_ns"].iloc[0] == pytest.approx(33 * MS)
    assert cuts["limit_ns"].iloc[0] == STEP + 47 * MS  # its last op stage 0 waited for


def test_the_bubble_at_its_theoretical_value_shortens_the_late_stages_work_and_propagates():
    answer = answers_of(*late_second_stage())["pipeline_bubble_theoretical"]
    # stage 1's 30, 5 and 10 ms of work before its send at 47 scaled by 1 - 33/45: 8, 1.33 and
    # 2.67 ms; its gradient arrives at 14 instead of 47, stage 0 ends at 27 instead of 60
    assert answer["change"] == "pipeline bubble at its theoretical 33.3% (2 stages, 2 microbatches)"
    assert answer["ranks"] == [1]
    assert answer["saved_ms_per_step"] == 33.0
    assert answer["predicted_step_ms"] == (60 + 55) / 2 - 33


def test_twice_the_microbatches_rescale_the_step_at_the_theoretical_bubble():
    answer = answers_of(*late_second_stage())["pipeline_microbatches"]
    # 24.5 ms at a third of bubble; with 4 microbatches the bubble is 1/5: 24.5 x (2/3) / (4/5)
    assert answer["change"] == ("pipeline with 4 microbatches instead of 2 (bubble 20.0% instead "
                                "of 33.3%)")
    assert answer["predicted_step_ms"] == pytest.approx(24.5 * (2 / 3) / (4 / 5), abs=1e-3)
    assert answer["saved_ms_per_step"] == pytest.approx(57.5 - 24.5 * (2 / 3) / (4 / 5),
                                                        abs=1e-3)
    assert answer["ranks"] == [0, 1] and "an estimate" in answer["assumptions"]


def test_a_pipeline_within_its_theoretical_bubble_gets_only_the_microbatch_estimate():
    # one microbatch (a half of bubble): stage 1 waits 9 ms of its 35, stage 0 19 of its 44
    rows = [op(0, 10 * MS, 12 * MS, name="send", peer=1),
            op(1, 1 * MS, 12 * MS, name="recv", peer=0),
            op(1, 32 * MS, 34 * MS, name="send", peer=0),
            op(0, 13 * MS, 34 * MS, name="recv", peer=1)]
    steps = pd.DataFrame({"rank": [0, 1], "step": 0, "start_ns": 0, "end_ns": [44 * MS, 35 * MS]})
    answers = answers_of(cross_rank_pass(frame(rows), steps, OFFSETS, 2), steps)
    assert "pipeline_bubble_theoretical" not in answers
    # the measured 39.5 ms x (1 - 1/2) / (1 - 1/3)
    assert answers["pipeline_microbatches"]["predicted_step_ms"] == pytest.approx(29.625)


def test_a_zero_bubble_schedule_or_unknown_microbatches_gets_no_pipeline_answer():
    cross, steps = late_second_stage()
    split = dataclasses.replace(cross, pipeline_schedule={**cross.pipeline_schedule,
                                                          "split_backward": True})
    assert not {"pipeline_bubble_theoretical", "pipeline_microbatches"} & set(
        answers_of(split, steps))
    unknown = dataclasses.replace(cross, pipeline_schedule={
        **cross.pipeline_schedule, "microbatches": None, "theory_bubble_pct": None})
    assert not {"pipeline_bubble_theoretical", "pipeline_microbatches"} & set(
        answers_of(unknown, steps))
    looped = dataclasses.replace(cross, pipeline_schedule={**cross.pipeline_schedule,
                                                           "kind": "looped"})
    assert set(answers_of(looped, steps)) >= {"pipeline_bubble_theoretical"}
    assert "pipeline_microbatches" not in answers_of(looped, steps)
