"""What one stage hands the next (analysis.core.contracts): a rank's tables taken as its
reduction made them or with the failure it recorded, a finding and a note as one type, and the
run's report."""

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.core.contracts import (
    FINDING_COLUMNS,
    NOTE_COLUMNS,
    Finding,
    NotReduced,
    RankTables,
    ReducedTableFailed,
    RunReport,
    failure_text,
)
from analysis.core.forked import ForkedResult
from analysis.core.frames import empty_events, steps_frame
from analysis.core.model import RankTrace


def _rank(tables: RankTables | None) -> RankTrace:
    return RankTrace(rank=3, world_size=4, path=Path("rank3.1.pt.trace.json.gz"),
                     events=empty_events(), steps=steps_frame(), records=None, problems=[],
                     tables=tables)


def test_a_table_is_the_reductions_and_a_failure_is_raised_where_it_is_taken():
    per_step = pd.DataFrame({"rank": [3], "step": [1]})
    trace = _rank(RankTables(per_step=per_step, failed={"hta": "ValueError: no kernel"}))
    assert trace.table("per_step") is per_step
    assert trace.table("stop_trace_ops") is None  # not built: none needed it
    with pytest.raises(ReducedTableFailed, match="rank 3's hta failed where its trace was "
                                                 "parsed: ValueError: no kernel") as raised:
        trace.table("hta")
    assert failure_text(raised.value) == "ValueError: no kernel"
    assert failure_text(KeyError("step")) == "KeyError: 'step'"


def test_a_rank_never_reduced_has_no_table_to_take():
    with pytest.raises(NotReduced, match="rank 3: not reduced, so it has no per_step"):
        _rank(None).table("per_step")


def test_a_table_computed_beside_is_waited_for_and_its_failure_is_the_tables():
    def broken():
        raise ValueError("no step end")

    done = _rank(RankTables(critical_path=ForkedResult(lambda: "the path")))
    assert done.table("critical_path") == "the path"
    failed = _rank(RankTables(critical_path=ForkedResult(broken)))
    with pytest.raises(ReducedTableFailed, match="critical_path failed .*ValueError: no step"):
        failed.table("critical_path")


def test_a_finding_and_a_note_are_one_type_with_their_own_rows():
    finding = Finding("exposed communication", 12.5, "20 ms of 100", "Overlap it.", "0-1")
    note = Finding("too few steps to name rank 1 late", evidence="3 steps", ranks="1",
                   note=True)
    assert list(finding.finding_row()) == FINDING_COLUMNS[:-1]
    assert finding.finding_row()["share_pct"] == 12.5 and not finding.note
    assert note.note_row() == {"note": "too few steps to name rank 1 late",
                               "evidence": "3 steps", "suggestion": "", "ranks": "1"}
    assert list(note.note_row()) == NOTE_COLUMNS and math.isnan(note.share_pct)


def test_the_reports_step_table_is_the_fuller_one_where_it_was_built():
    breakdown = pd.DataFrame({"rank": [0], "step": [1]})
    fuller = breakdown.assign(peak_rss_bytes=[1])
    fields = dict(name="r", path="p", files=[], world_size=1, steps_spec=None,
                  hta_compatible=False, problems=[], unavailable={}, ranks=[],
                  per_step=breakdown, totals=pd.DataFrame(), hta=pd.DataFrame(),
                  idle=pd.DataFrame(), idle_gaps=pd.DataFrame())
    assert RunReport(**fields, step_rows=fuller).step_table() is fuller
    assert RunReport(**fields).step_table() is breakdown
    empty = RunReport(**{**fields, "per_step": breakdown.iloc[:0]})
    assert empty.nothing_analysed() and not RunReport(**fields).nothing_analysed()
