"""The capture windows in the analysis (analysis.findings.capture_windows): the window's steps
against the steps before its trigger, each rank's wait in them, and the rank the others waited
for."""

import pandas as pd
import pytest

from analysis.findings.capture_windows import analysed_captures
from analysis.findings.verdict import run_verdict

WINDOW = {"trigger": "slow_step", "rank": 1, "step": 20, "ratio": 2.5, "first_step": 23,
          "steps": [23, 24, 25], "ranks_with_window": [0, 1], "ranks_missed": []}


def _steps():
    # 30 ms steps until step 19, 90 ms from step 20: rank 0 waits 60 ms per step for rank 1
    rows = [{"rank": r, "step": s, "step_ns": (90e6 if s >= 20 else 30e6)}
            for s in range(1, 31) for r in (0, 1)]
    waits = [{"rank": r, "step": s, "wait_for_peers_ms": 60.0 if (r == 0 and s >= 20) else 0.0}
             for s in range(1, 31) for r in (0, 1)]
    return pd.DataFrame(rows), pd.DataFrame(waits)


def test_a_slow_step_window_names_the_rank_the_others_waited_for():
    steps, waits = _steps()
    (window,) = analysed_captures([WINDOW], steps, waits)
    assert window["mean_step_ms"] == 90.0 and window["before_step_ms"] == 30.0
    assert window["wait_ms_per_step"] == {0: 60.0, 1: 0.0} and window["late_rank"] == 1
    assert window["text"] == (
        "steps 23-25 captured on ranks 0, 1 (rank 1's step 20 took 2.5x its running median); "
        "mean step 90.00 ms against 30.00 ms before; the others waited 60.00 ms per step for "
        "rank 1.")


def test_a_window_where_nobody_waits_names_no_rank_and_one_on_demand_says_so():
    steps, waits = _steps()
    waits["wait_for_peers_ms"] = 0.0
    asked = {**WINDOW, "trigger": "on_demand", "rank": None, "step": None, "ratio": None}
    (window,) = analysed_captures([asked], steps, waits)
    assert window["late_rank"] is None
    assert window["before_step_ms"] == pytest.approx((19 * 30.0 + 3 * 90.0) / 22)  # 1-22
    assert "(asked on demand)" in window["text"] and "no rank was waited for" in window["text"]
    (small,) = analysed_captures([WINDOW], steps, waits.assign(
        wait_for_peers_ms=[4.0 if r == 0 else 0.0 for r in waits["rank"]]))
    assert small["late_rank"] is None  # 4 ms of a 90 ms step: under 5%


def test_the_verdict_has_a_line_per_window():
    steps, waits = _steps()
    windows = analysed_captures([WINDOW], steps, waits)
    verdict = run_verdict(steps, None, None, None, None, windows)
    assert verdict.lines[-1] == "Captured: " + windows[0]["text"]
    assert not [line for line in run_verdict(steps, None, None, None).lines
                if line.startswith("Captured")]
