"""Blame along waiting chains and the pipeline's transfer time, on hand-built op frames whose
answers are known exactly (docs/cross-rank.md, "Culprit and victims" and "Pipeline bubbles")."""

import pandas as pd
import pytest

from analysis.crossrank import analyse
from analysis.report.json_document import cross_rank_json
from helpers.crossrank_ops import MS, frame, op, steps_frame, synced

STEPS = 10
SYNCED = pd.DataFrame({"rank": [1, 2], "offset_ns": [0, 0], "uncertainty_ns": [1_000, 1_000]})


def _chain_run():
    """Rank 2 arrives 10 ms late at an all-reduce with rank 1 (group a); rank 1 then computes
    1 ms and only then joins rank 0's all-reduce (group b), which rank 0 entered at once."""
    rows = []
    for s in range(STEPS):
        t = s * 100 * MS
        rows += [op(1, t, t + 11 * MS, step=s, pg="a"), op(2, t + 10 * MS, t + 11 * MS, step=s,
                                                          pg="a"),
                 op(0, t, t + 13 * MS, step=s, pg="b"), op(1, t + 12 * MS, t + 13 * MS, step=s,
                                                          pg="b")]
    return frame(rows)


def test_a_wait_caused_by_a_rank_that_was_itself_waiting_is_charged_to_the_root():
    result = analyse(_chain_run(), steps_frame(range(3), range(STEPS)), SYNCED, 3)
    table = result.stragglers.set_index("rank")
    # Rank 0 waits 12 ms for rank 1, 10 of which rank 1 spent waiting for rank 2.
    assert table.loc[2, "caused_wait_ms_per_step"] == pytest.approx(20.0)
    assert table.loc[1, "caused_wait_ms_per_step"] == pytest.approx(2.0)
    assert [s["rank"] for s in cross_rank_json(result)["stragglers"]] == [2]


def _pipeline_chain_run():
    """Gradients flow 2 -> 1 -> 0. Stage 2 sends 10 ms late; stage 1 computes 2 ms after its
    recv, then sends to stage 0, which has waited since the step began."""
    rows = []
    for s in range(STEPS):
        t = s * 100 * MS
        rows += [op(2, t + 10 * MS, t + 11 * MS, step=s, name="send", peer=1),
                 op(1, t, t + 11 * MS, step=s, name="recv", peer=2),
                 op(1, t + 13 * MS, t + 14 * MS, step=s, name="send", peer=0),
                 op(0, t, t + 14 * MS, step=s, name="recv", peer=1)]
    return frame(rows)


def test_the_stage_that_holds_back_is_the_root_of_the_waiting_chain():
    work = pd.DataFrame([{"rank": r, "step": s, "step_ns": 100 * MS, "work_ns": 50 * MS}
                         for r in range(3) for s in range(STEPS)])
    result = analyse(_pipeline_chain_run(), steps_frame(range(3), range(STEPS)), SYNCED, 3,
                     work=work)
    table = result.pipeline.set_index("rank")
    assert table.loc[2, "caused_recv_wait_ms_per_step"] == pytest.approx(20.0)  # 10 + 10 passed
    assert table.loc[1, "caused_recv_wait_ms_per_step"] == pytest.approx(3.0)
    assert table["holds_back"].tolist() == [False, False, True]


def test_pipeline_transfer_counts_overlapping_transfers_once():
    # Rank 0's send (stamped complete late, at 10 ms) and its recv (from 2 ms) both transfer
    # until 10 ms: 10 ms of transfer in the step, not 18.
    rows = []
    for s in range(2):
        t = s * 100 * MS
        rows += [op(0, t, t + 10 * MS, step=s, name="send", peer=1),
                 op(1, t, t + 1 * MS, step=s, name="recv", peer=0),
                 op(0, t + 2 * MS, t + 10 * MS, step=s, name="recv", peer=1),
                 op(1, t + 2 * MS, t + 3 * MS, step=s, name="send", peer=0)]
    work = pd.DataFrame([{"rank": r, "step": s, "step_ns": 100 * MS, "work_ns": 50 * MS}
                         for r in range(2) for s in range(2)])
    # p2p ops place no clock: the ranks' clock_sync does
    result = analyse(frame(rows), steps_frame([0, 1], [0, 1]), synced([0, 1]), 2, work=work)
    table = result.pipeline.set_index("rank")
    assert table.loc[0, "transfer_pct"] == pytest.approx(10.0)
    assert table.loc[0, "idle_pct"] == pytest.approx(40.0)


def test_a_late_last_stage_is_named_although_each_transfer_is_long():
    """Gradients flow 3 -> 2 -> 1 -> 0; stage 3 sends 10 ms late and every transfer takes 4 ms
    (gloo stamps sends late). Each p2p instance has one waiting member, so the 30 ms charged to
    stage 3 per step weigh against 3 x 4 ms of transfer, not against a third of it."""
    rows = []
    for s in range(STEPS):
        t = s * 100 * MS
        rows += [op(3, t + 10 * MS, t + 14 * MS, step=s, name="send", peer=2),
                 op(2, t, t + 14 * MS, step=s, name="recv", peer=3)]
        for stage in (2, 1):  # each stage forwards at once what it received
            sent = t + (14 + 4 * (2 - stage)) * MS
            rows += [op(stage, sent, sent + 4 * MS, step=s, name="send", peer=stage - 1),
                     op(stage - 1, t, sent + 4 * MS, step=s, name="recv", peer=stage)]
    synced = pd.DataFrame({"rank": [1, 2, 3], "offset_ns": 0, "uncertainty_ns": 1_000})
    result = analyse(frame(rows), steps_frame(range(4), range(STEPS)), synced, 4)
    assert [s["rank"] for s in cross_rank_json(result)["stragglers"]] == [3]
    table = result.stragglers.set_index("rank")
    assert table.loc[3, "caused_wait_ms_per_step"] == pytest.approx(30.0)
    assert table.loc[3, "material"]
