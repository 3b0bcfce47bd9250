"""The verdict on a run of several phases (analysis.findings.phase_lines, docs/report.md "The
verdict"): the phase that matters most first, in plain words, with its own late rank, waits and
what-if; the other phases after it; a run of one phase says nothing of phases."""

import pandas as pd

from analysis.core.contracts import CriticalPath, Phase
from analysis.findings.phase_lines import lead_phase, phase_opening, span_text
from analysis.findings.verdict import run_verdict


def phase(first, last, share, step_ms, waits, late=None, late_ms=None, what_if=None):
    return Phase(first_step=first, last_step=last, steps=last - first + 1, share_pct=share,
                 step_ms=step_ms, ranks={r: {"step_ms": step_ms, "wait_ms": w}
                                         for r, w in waits.items()},
                 late_rank=late, late_ms_per_step=late_ms,
                 waiting_ranks=[r for r in waits if late is not None and r != late],
                 what_if=what_if)


ON_TIME = {"change": "rank 1 on time", "kind": "rank_on_time", "ranks": [1],
           "saved_ms_per_step": 60.0, "predicted_step_ms": 1.2, "steps": 100}
BEFORE = phase(1, 1999, 39.0, 1.1, {0: 0.3, 1: 0.2})
SLOW = phase(2000, 2099, 61.0, 61.2, {0: 60.0, 1: 0.0}, late=1, late_ms=60.0, what_if=ON_TIME)


def per_step_rows():
    return pd.DataFrame({"rank": [0, 1, 0, 1], "step": [1, 1, 2, 2],
                         "step_ns": [1e6, 1e6, 61e6, 61e6]})


def test_a_slow_last_phase_with_a_late_rank_opens_the_verdict_in_plain_words():
    opening = phase_opening([BEFORE, SLOW])
    assert opening.lines == [
        "From step 2000 (the last 100 steps, 61% of the run's time) rank 1 is late by 60.00 ms "
        "per step; rank 0 waits for it; mean step 61.20 ms.",
        "What if, in those steps: if rank 1 were on time: 1.20 ms per step instead of 61.20 "
        "(-98%) over its 100 steps of the critical path (docs/critical-path.md).",
        "Before that (steps 1-1999, 39% of the run's time): no rank is late, waits: rank 0 "
        "0.30 ms, rank 1 0.20 ms per step; mean step 1.10 ms.",
        "Phases: 2, the run changed at step 2000 (docs/definitions.md, \"Phases\"); the tables "
        "below cover the whole run."]
    assert opening.change.startswith("Find what rank 1 does differently from step 2000 on: ")
    assert opening.change_ms_per_step == 60.0
    assert opening.what_if.startswith("if rank 1 were on time: 1.20 ms per step")


def test_the_verdict_of_several_phases_quotes_each_phase_and_not_the_whole_run():
    whole_run_what_if = [{"change": "rank 1 on time", "kind": "rank_on_time", "ranks": [1],
                          "saved_ms_per_step": 2.9, "predicted_step_ms": 0.6}]
    critical = CriticalPath(pd.DataFrame(), pd.DataFrame({"step": range(2099)}),
                            pd.DataFrame(), what_if=whole_run_what_if)
    verdict = run_verdict(per_step_rows(), pd.DataFrame(), pd.DataFrame(), None, critical,
                          phases=[BEFORE, SLOW])
    assert verdict.lines[0].startswith("From step 2000 (the last 100 steps")
    assert verdict.lines[4].startswith("Limits the step (whole run): Nothing found wrong")
    assert verdict.lines[5].startswith(
        "Try first (60.00 ms per step at stake in those steps): Find what rank 1 does")
    assert len(verdict.lines) == 6
    # no whole-run Waiting or What if line: the phases' own say it
    assert not any(line.startswith(("Waiting:", "What if:")) for line in verdict.lines)
    assert verdict.state == "bottleneck"
    assert verdict.what_if.startswith("if rank 1 were on time: 1.20 ms per step")
    assert verdict.waits.startswith("From step 2000") and "Before that" in verdict.waits


def test_one_phase_leaves_the_verdict_as_it_was():
    rows = per_step_rows()
    alone = run_verdict(rows, pd.DataFrame(), pd.DataFrame(), None)
    assert run_verdict(rows, pd.DataFrame(), pd.DataFrame(), None,
                       phases=[phase(1, 2, 100.0, 31.0, {0: 0.0, 1: 0.0})]).lines == alone.lines
    assert alone.lines[0].startswith("Limits the step: Nothing found wrong")
    assert phase_opening([]) is None


def test_a_middle_phase_is_told_with_what_comes_before_and_after():
    first = phase(1, 35, 9.0, 8.5, {0: 2.2, 1: 1.1})
    middle = phase(36, 71, 74.0, 67.1, {0: 59.4, 1: 0.0}, late=1, late_ms=59.4)
    last = phase(72, 119, 17.0, 11.9, {0: 3.9, 1: 0.3})
    phases = [first, middle, last]
    lines = phase_opening(phases).lines
    assert lines[0].startswith("From step 36 to 71 (36 steps, 74% of the run's time) rank 1 is "
                               "late by 59.40 ms per step")
    assert lines[1].startswith("Before that (steps 1-35, 9% of the run's time)")
    assert lines[2].startswith("After that (steps 72-119, 17% of the run's time)")
    assert lines[3].startswith("Phases: 3, the run changed at steps 36, 72 ")
    assert span_text(first, phases) == "Until step 35 (the first 35 steps"


def test_without_a_late_rank_the_slowest_phase_leads_and_nothing_is_to_try_from_it():
    fast, slow = phase(1, 500, 20.0, 1.0, {0: 0.1, 1: 0.1}), phase(501, 900, 80.0, 6.0,
                                                                    {0: 0.1, 1: 0.1})
    assert lead_phase([fast, slow]) is slow
    opening = phase_opening([fast, slow])
    assert opening.lines[0] == ("From step 501 (the last 400 steps, 80% of the run's time) no "
                                "rank is late, waits: rank 0 0.10 ms, rank 1 0.10 ms per step; "
                                "mean step 6.00 ms.")
    assert opening.change is None and opening.what_if is None


def test_the_late_phase_with_the_most_time_leads():
    small = phase(100, 199, 10.0, 20.0, {0: 0.0, 1: 19.0}, late=0, late_ms=19.0)
    big = phase(300, 399, 50.0, 60.0, {0: 59.0, 1: 0.0}, late=1, late_ms=59.0)
    quiet = [phase(1, 99, 5.0, 1.0, {0: 0, 1: 0}), phase(200, 299, 5.0, 1.0, {0: 0, 1: 0}),
             phase(400, 500, 30.0, 1.0, {0: 0, 1: 0})]
    phases = [quiet[0], small, quiet[1], big, quiet[2]]
    assert lead_phase(phases) is big
    lines = phase_opening(phases).lines
    # its neighbours, then the larger of the other two (steps 100-199), in step order
    assert [line.split(" (")[0] for line in lines[1:4]] == ["Then", "Before that", "After that"]
    assert lines[1].startswith("Then (steps 100-199, 10% of the run's time): rank 0 is late")
    assert lines[4] == "And 1 more phase(s), 5% of the run's time (the phases table)."


def test_many_phases_tell_the_lead_its_neighbours_and_the_largest_then_count_the_rest():
    phases = [phase(100 * k + 1, 100 * k + 100, 8.0 + k, 1.0, {0: 0.1, 1: 0.1}) for k in range(8)]
    phases[6] = phase(601, 700, 30.0, 60.0, {0: 59.0, 1: 0.0}, late=1, late_ms=59.0)
    lines = phase_opening(phases).lines
    assert lines[0].startswith("From step 601 to 700 (100 steps")
    # before and after it, then the largest of the rest (steps 401-500, 12%), in step order
    assert [line.split(":")[0] for line in lines[1:4]] == [
        "Then (steps 401-500, 12% of the run's time)",
        "Before that (steps 501-600, 13% of the run's time)",
        "After that (steps 701-800, 15% of the run's time)"]
    assert lines[4] == "And 4 more phase(s), 38% of the run's time (the phases table)."
    assert lines[5].startswith("Phases: 8, the run changed at steps 101, 201, ")
