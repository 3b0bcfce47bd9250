"""analysis.findings.verdict: the lines the report opens with, on inputs with known answers
(docs/report.md, "The verdict")."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.core.contracts import CriticalPath
from analysis.findings.bottlenecks import find_bottlenecks
from analysis.findings.notes import find_notes
from analysis.findings.verdict import mean_waits, run_verdict, what_if_line
from helpers.findings_inputs import (
    collective,
    collectives,
    gaps,
    late_rank_1,
    memory_rank,
    per_step,
    run,
    step_row,
    trace,
)


def verdict_of(steps, colls=None, traces=None, cross=None):
    colls = colls if colls is not None else collectives([])
    traces = traces if traces is not None else [trace(0, "gloo"), trace(1, "gloo")]
    found = find_bottlenecks(steps, pd.DataFrame(), colls, gaps([]), traces, cross_rank=cross)
    notes = find_notes(steps, colls, traces, cross)
    return run_verdict(steps, found, notes, cross)


def test_the_verdict_names_the_largest_cost_the_waits_and_the_change_with_its_ms():
    table, colls, result = late_rank_1(steps=12)  # rank 1 named late: 30 ms per step
    verdict = verdict_of(table, colls, cross=result)
    assert verdict.state == "bottleneck"
    assert verdict.step_ms == pytest.approx(100.0)
    assert verdict.change_ms_per_step == pytest.approx(15.0)  # 15% of a 100 ms step
    assert verdict.lines[0] == ("Limits the step: Ranks wait for rank 1 costs 15.00 ms of the "
                                   "100.00 ms mean step (15.0%), ranks 0.")
    assert verdict.lines[1] == ("Waiting: The other ranks wait for rank 1 (30.00 ms per "
                                   "step); each rank's wait: rank 0 30.00 ms, rank 1 0.00 ms.")
    assert verdict.lines[2].startswith(
        "Try first (up to 15.00 ms per step at stake; the what-if model cannot price it): ")
    assert len(verdict.lines) == 3


def test_waits_are_the_mean_over_the_analysed_steps_only():
    table, colls, result = late_rank_1(steps=12)
    four = table[table["step"] < 4]
    waits = result.waits
    assert mean_waits(four, waits).to_dict() == pytest.approx({0: 30.0, 1: 0.0})
    # a step the waits table does not hold counts as no wait
    thinned = waits[~((waits["rank"] == 0) & (waits["step"] == 0))]
    assert mean_waits(four, thinned).to_dict() == pytest.approx({0: 22.5, 1: 0.0})


def test_ranks_that_never_communicate_are_the_verdict():
    steps = per_step([step_row(r, s, comm=0, overlap=0, exposed=0) for r in (0, 1)
                      for s in range(3)])
    verdict = verdict_of(steps, traces=[trace(r, "gloo", started=True) for r in (0, 1)])
    assert verdict.state == "ranks train alone"
    assert verdict.lines[0] == ("Limits the step: The ranks never communicated: ranks 0-1 "
                                   "each trained alone, with no collective in any step (mean "
                                   "step 100.00 ms).")
    assert verdict.lines[1] == "Waiting: No rank waits for another: no collective ran."
    assert "accelerator.num_processes" in verdict.lines[2]
    assert verdict.change_ms_per_step is None


def test_nothing_wrong_is_said_plainly():
    steps = per_step([step_row(r, s, compute=90, comm=0, overlap=10, exposed=0, idle=0)
                      for r in (0, 1) for s in range(3)])
    colls = collectives([collective("all_reduce", "0", 2, 256, 100, 0.1, issuer="ddp")])
    verdict = verdict_of(steps, colls)
    assert verdict.state == "nothing found"
    assert verdict.lines == [
        "Limits the step: Nothing found wrong: no finding passed its threshold (mean step "
        "100.00 ms over 6 analysed rank-steps of ranks 0-1).",
        "Waiting: Who waits for whom is not known: the cross-rank pass matched no collective.",
        "Try first: nothing stands out to change.",
    ]


def test_when_a_note_is_all_there_is_the_verdict_says_so():
    steps = per_step([step_row(0, s, compute=90, comm=0, overlap=10, exposed=0, idle=0)
                      for s in range(3)])
    traces = [trace(0, "gloo", started=True, world_size=4)]
    colls = collectives([collective("all_reduce", "0", 4, 256, 100, 0.1, issuer="ddp")])
    verdict = verdict_of(steps, colls, traces)
    assert verdict.state == "notes only"
    assert verdict.lines[0] == ("Limits the step: No finding passed its threshold (mean step "
                                   "100.00 ms); 1 note(s) say what could not be told: 1 of 4 "
                                   "ranks analysed.")
    assert verdict.lines[1] == ("Waiting: One rank analysed: no other rank in these traces "
                                   "to wait for.")
    assert verdict.lines[2] == ("Try first: nothing stands out to change; see the notes (1 of "
                                   "4 ranks analysed).")


def test_no_step_no_verdict():
    verdict = run_verdict(per_step([]), run(per_step([])), None, None)
    assert verdict.state == "no step" and verdict.limits is None
    assert verdict.lines == ["No step was analysed: there is no verdict (the warnings say "
                                "why)."]


def test_a_risk_without_a_time_cost_is_named_but_not_timed():
    steps = per_step([step_row(r, s, compute=90, comm=0, overlap=10, exposed=0, idle=0)
                      for r in (0, 1) for s in range(3)])
    colls = collectives([collective("all_reduce", "0", 2, 256, 100, 0.1, issuer="ddp")])
    traces = [trace(0, "gloo"), trace(1, "gloo")]
    found = find_bottlenecks(steps, pd.DataFrame([memory_rank(0, 38, 30)]), colls, gaps([]),
                             traces)
    verdict = run_verdict(steps, found, find_notes(steps, colls, traces), None)
    assert verdict.state == "risk" and verdict.change_ms_per_step is None
    assert verdict.lines[0] == ("Limits the step: No finding costs step time past its "
                                   "threshold (mean step 100.00 ms); one risk: memory near "
                                   "capacity, ranks 0.")
    assert verdict.lines[2].startswith("Try first: One allocation spike away from an "
                                          "out-of-memory error")


def _answer(change, kind, ranks, saved, predicted):
    return {"change": change, "kind": kind, "ranks": ranks, "saved_ms_per_step": saved,
            "predicted_step_ms": predicted, "assumptions": "..."}


def test_the_verdict_quotes_the_top_what_if_with_the_step_it_replaces():
    table, colls, result = late_rank_1(steps=12)
    found = find_bottlenecks(table, pd.DataFrame(), colls, gaps([]),
                             [trace(0, "gloo"), trace(1, "gloo")], cross_rank=result)
    critical = CriticalPath(
        critical_path=pd.DataFrame(), critical_path_steps=pd.DataFrame({"step": range(12)}),
        critical_path_segments=pd.DataFrame(), what_if=[
            _answer("rank 1 on time", "rank_on_time", [1], 25.8, 15.2),
            _answer("all_reduce on group 0 (1-2 MiB) transfer overlapped",
                    "transfer_overlapped", [0, 1], 3.0, 38.0)])
    verdict = run_verdict(table, found, find_notes(table, colls, [], result), result, critical)
    # 15.2 + 25.8 = 41.0 ms measured; 25.8 / 41.0 = 62.9% saved
    assert verdict.what_if == ("if rank 1 were on time: 15.20 ms per step instead of 41.00 "
                                  "(-63%) over the 12 steps of the critical path "
                                  "(docs/critical-path.md).")
    assert verdict.lines[2] == f"What if: {verdict.what_if}"
    assert verdict.lines[3].startswith("Try first")


def test_a_transfer_what_if_is_quoted_by_its_change_and_a_negligible_one_not_at_all():
    overlapped = _answer("all_reduce on group 0 (1-2 MiB) transfer overlapped",
                         "transfer_overlapped", [0, 1], 2.0, 38.0)
    assert what_if_line([overlapped], 4) == (
        "if all_reduce on group 0 (1-2 MiB) transfer overlapped: 38.00 ms per step instead of "
        "40.00 (-5%) over the 4 steps of the critical path (docs/critical-path.md).")
    assert what_if_line([_answer("rank 0 on time", "rank_on_time", [0], 0.01, 40.0)]) is None
    assert what_if_line([]) is None
    table, colls, result = late_rank_1(steps=12)
    assert run_verdict(table, None, None, result).what_if is None


def test_the_verdict_quotes_a_pipeline_or_idle_answer_as_a_condition_but_no_estimate():
    estimate = _answer("pipeline with 8 microbatches instead of 4 (bubble 11.1% instead of "
                       "20.0%)", "pipeline_microbatches", [0, 1], 20.0, 10.0)
    bubble = _answer("pipeline bubble at its theoretical 20.0% (2 stages, 4 microbatches)",
                     "pipeline_bubble_theoretical", [1], 18.0, 12.0)
    assert what_if_line([estimate, bubble], 3) == (
        "if the pipeline bubble were at its theoretical 20.0% (2 stages, 4 microbatches): 12.00 "
        "ms per step instead of 30.00 (-60%) over the 3 steps of the critical path "
        "(docs/critical-path.md).")
    loading = _answer("no data loading gaps on rank 1", "idle_cause_removed", [1], 20.0, 11.0)
    assert what_if_line([loading]).startswith(
        "if there were no data loading gaps on rank 1: 11.00 ms per step instead of 31.00")
    assert what_if_line([estimate]) is None


def test_the_memory_line_follows_who_waits_for_whom_and_is_kept_apart():
    table, colls, result = late_rank_1(steps=12)
    found = find_bottlenecks(table, pd.DataFrame(), colls, gaps([]),
                             [trace(0, "gloo"), trace(1, "gloo")], cross_rank=result)
    line = "Memory: rank 1 grows 2.00 MiB per step from step 20."
    verdict = run_verdict(table, found, None, result, memory_line=line)
    assert verdict.lines[1].startswith("Waiting: ") and verdict.lines[2] == line
    assert verdict.memory == line and len(verdict.lines) == 4
    assert run_verdict(table, found, None, result).memory is None
    no_step = run_verdict(per_step([]), found, None, result, memory_line=line)
    assert no_step.state == "no step" and no_step.lines[-1] == line
