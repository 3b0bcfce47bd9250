"""The capture windows of a run grouped across ranks (analysis.ingest.capture_records), on records
with known answers: one window per (trigger, first step, length), its trigger as most ranks say, the
ranks that traced every one of its steps, and those that learnt of it too late."""

from __future__ import annotations

import pandas as pd

from analysis.core.model import RunRecords
from analysis.ingest.capture_records import group_captures
from tracer import schema


def rank_records(rank: int, profiled: list[int], captures: list[dict]) -> RunRecords:
    steps = pd.DataFrame({"step": list(range(40)),
                          "in_profiler_window": [s in profiled for s in range(40)]})
    manifest = [schema.CaptureRecord(rank=rank, t_ns=1, **c) for c in captures]
    return RunRecords(comms=pd.DataFrame(), samples=pd.DataFrame(), steps=steps,
                      manifest=manifest)


SLOW = dict(trigger="slow_step", trigger_step=20, first_step=30, steps=3, trigger_rank=1,
            ratio=5.0)
ASKED = dict(trigger="on_demand", trigger_step=12, first_step=16, steps=2)


def test_windows_are_grouped_across_ranks_with_the_ranks_that_traced_them():
    records = {
        0: rank_records(0, [6, 7, 8, 9, 15, 16, 17, 29, 30, 31, 32], [ASKED, SLOW]),
        1: rank_records(1, [6, 7, 8, 9, 29, 30, 31, 32], [{**ASKED, "missed": True}, SLOW]),
        2: rank_records(2, [6, 7, 8, 9, 15, 16, 17, 29, 30, 31], [ASKED, SLOW]),
    }
    windows, problems = group_captures(records)
    assert problems == []
    assert windows == [
        {"trigger": "on_demand", "rank": None, "step": 12, "ratio": None, "first_step": 16,
         "steps": [16, 17], "ranks_with_window": [0, 2], "ranks_missed": [1]},
        # Rank 2's step records lack step 32 in a window: it did not trace all of it.
        {"trigger": "slow_step", "rank": 1, "step": 20, "ratio": 5.0, "first_step": 30,
         "steps": [30, 31, 32], "ranks_with_window": [0, 1], "ranks_missed": []},
    ]


def test_a_rank_naming_another_trigger_is_a_problem_and_the_most_ranks_win():
    other = {**SLOW, "trigger_rank": 0, "trigger_step": 21, "ratio": 4.0}
    records = {r: rank_records(r, [29, 30, 31, 32], [other if r == 2 else SLOW])
               for r in range(3)}
    windows, problems = group_captures(records)
    assert [(w["rank"], w["step"], w["ratio"]) for w in windows] == [(1, 20, 5.0)]
    assert problems == ["capture window of steps 30-32: ranks [2] name another trigger than "
                        "the others' (rank 1, step 20); the most ranks' is used"]


def test_a_run_without_capture_records_has_no_windows():
    assert group_captures({0: rank_records(0, [6, 7, 8, 9], [])}) == ([], [])
