"""analysis.findings.notes and what it changes in the findings: ranks that never communicated are
one finding, first; notes are kept apart and carry no share; measured waits replace the
work-based estimate (docs/report.md, "Notes" and "Ranks train alone")."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from analysis.core.contracts import Finding
from analysis.findings.bottlenecks import find_bottlenecks
from analysis.findings.notes import NOTE_COLUMNS, find_notes, world_size
from helpers.findings_inputs import (
    MIB,
    collective,
    collectives,
    finding,
    gaps,
    late_rank_1,
    per_step,
    run,
    step_row,
    trace,
)


def uneven_steps():
    """Rank 1 works 90 ms of every 100 ms step, rank 0 60 ms: a straggler by work spread."""
    return per_step([step_row(0, s, compute=50, comm=0, overlap=10, exposed=0) for s in range(4)]
                    + [step_row(1, s, compute=80, comm=0, overlap=10, exposed=0)
                       for s in range(4)])


def recorded(ranks=(0, 1), **options):
    return [trace(r, "gloo", started=True, **options) for r in ranks]


def test_ranks_that_never_communicate_are_one_finding_first_and_no_straggler_is_named():
    result = run(uneven_steps(), traces=recorded())
    assert result["finding"].iloc[0] == "ranks train alone"
    alone = finding(result, "ranks train alone")
    assert math.isnan(alone["share_pct"]) and math.isnan(alone["ms_per_step"])
    assert "world size 2, yet none of its 2 analysed rank(s) issued a collective" in \
        alone["evidence"]
    assert "Accelerator(cpu=True)" in alone["suggestion"]
    assert "init_process_group" in alone["suggestion"]
    assert alone["ranks"] == "0-1"
    assert not result["finding"].str.contains("straggler|imbalance").any()


def test_with_a_collective_the_same_steps_name_the_straggler():
    colls = collectives([collective("all_reduce", "0", 2, 256, 100, 0.1, issuer="ddp")])
    result = run(uneven_steps(), colls=colls, traces=recorded())
    assert "ranks train alone" not in result["finding"].tolist()
    row = finding(result, "straggler: rank 1")
    # wait = 90 - 75 = 15 ms per step of a 100 ms step
    assert row["share_pct"] == pytest.approx(15.0)
    assert row["ms_per_step"] == pytest.approx(15.0)


def test_comms_records_also_count_as_communication():
    comms = pd.DataFrame([{"step": 0, "op": "all_reduce", "rank": 0}])
    traces = [trace(0, "gloo", started=True, comms=comms), trace(1, "gloo", started=True)]
    assert "ranks train alone" not in run(uneven_steps(), traces=traces)["finding"].tolist()


def test_one_rank_runs_and_runs_without_comms_records_are_not_called_alone():
    one = per_step([step_row(0, s) for s in range(3)])
    assert "ranks train alone" not in run(one, traces=recorded((0,), world_size=1))[
        "finding"].tolist()
    off = recorded(config={"no_comms": True})
    assert "ranks train alone" not in run(uneven_steps(), traces=off)["finding"].tolist()
    notes = find_notes(uneven_steps(), collectives([]), off)
    assert notes["note"].tolist() == ["no collective traced, and collectives were not recorded"]
    assert "whether the ranks communicated at all is not known" in notes["evidence"].iloc[0]


def test_the_world_size_comes_from_the_traces_or_the_manifests():
    assert world_size(recorded(world_size=4)) == 4
    assert world_size([trace(0)]) == 2  # the trace's own distributedInfo
    assert world_size([]) is None


def test_too_few_steps_is_a_note_not_a_finding_and_the_measured_wait_is_the_finding():
    table, colls, result = late_rank_1(steps=4)  # 4 clean steps: too few to name rank 1 late
    found = find_bottlenecks(table, pd.DataFrame(), colls, gaps([]), [trace(0), trace(1)],
                             cross_rank=result)
    assert not found["finding"].str.startswith("too few steps").any()
    assert "straggler: rank 1" not in found["finding"].tolist()
    assert "load imbalance across ranks" not in found["finding"].tolist()
    row = finding(found, "waiting for peers")
    # rank 0 waits 30 ms in each of 4 steps; 2 ranks x 4 steps x 100 ms
    assert row["share_pct"] == pytest.approx(30 * 4 / 800 * 100)
    assert row["ms_per_step"] == pytest.approx(15.0)
    assert "rank 0 30.00 ms, rank 1 0.00 ms" in row["evidence"]
    assert row["ranks"] == "0"
    notes = find_notes(table, colls, [trace(0), trace(1)], result)
    assert list(notes.columns) == NOTE_COLUMNS and "share_pct" not in notes.columns
    assert notes["note"].tolist() == ["too few steps to name rank 1 late"]
    assert notes["ranks"].tolist() == ["1"]


def test_the_cross_rank_notes_are_read_as_they_are():
    table, colls, result = late_rank_1(steps=4)
    result = dataclasses.replace(result, notes=(
        Finding("rank 1 was last in 4 steps, 10 needed", note=True),))
    notes = find_notes(table, colls, [trace(0), trace(1)], result)
    assert notes.to_dict("records") == [{"note": "rank 1 was last in 4 steps, 10 needed",
                                         "evidence": "", "suggestion": "", "ranks": ""}]


def test_missing_ranks_are_a_note():
    steps = per_step([step_row(0, s) for s in range(3)])
    notes = find_notes(steps, collectives([collective("all_reduce", "0", 4, MIB, 10, 1.0)]),
                       recorded((0,), world_size=4))
    assert notes["note"].tolist() == ["1 of 4 ranks analysed"]
    assert notes["ranks"].tolist() == ["0"]
