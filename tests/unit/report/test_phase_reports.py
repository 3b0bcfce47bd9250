"""The run's phases in the writers (docs/definitions.md, "Phases"): the JSON document's
`phases`, the text report's Phases table (only for several), the HTML report's step time over
the run with the phases shaded, and analysis.diff's phases line."""

from __future__ import annotations

import dataclasses
import re

import pandas as pd
import pytest

from analysis.core.contracts import Phase
from analysis.diff.compare import phases_line
from analysis.report.html.charts import lines as line_chart
from analysis.report.html.page import build_html
from analysis.report.json_document import run_document
from analysis.report.phase_table import MAX_DRAWN_STEPS, phase_table, step_time_lines
from analysis.report.text_report import text_report
from analysis.run.analysed_run import open_run
from helpers.synthetic import nccl_run

ON_TIME = {"change": "rank 1 on time", "kind": "rank_on_time", "ranks": [1],
           "saved_ms_per_step": 60.0, "predicted_step_ms": 1.2, "steps": 2}
PHASES = [Phase(0, 1, 2, 20.0, 9.0, {0: {"step_ms": 9.0, "wait_ms": 0.1},
                                     1: {"step_ms": 9.0, "wait_ms": 0.2}}, None, None),
          Phase(2, 2, 1, 80.0, 61.2, {0: {"step_ms": 61.2, "wait_ms": 60.0},
                                      1: {"step_ms": 61.2, "wait_ms": None}}, 1, 60.0, [0],
                ON_TIME)]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two GPU ranks, 3 steps of 9 ms, as analysed: one phase."""
    return open_run(nccl_run(tmp_path_factory.mktemp("phases")), use_cache=False).report


def test_a_run_of_one_phase_has_it_in_its_document_and_nothing_in_its_text(report):
    (phase,) = run_document(report)["phases"]
    assert (phase["first_step"], phase["last_step"], phase["steps"]) == (0, 2, 3)
    assert phase["share_pct"] == pytest.approx(100.0)
    assert phase["step_ms"] == pytest.approx(9.0)
    # one NCCL kernel a step, the ranks in step: nobody waits
    assert phase["ranks"] == {"0": {"step_ms": pytest.approx(9.0), "wait_ms": 0.0},
                              "1": {"step_ms": pytest.approx(9.0), "wait_ms": 0.0}}
    assert (phase["late_rank"], phase["waiting_ranks"]) == (None, [])
    assert "Phases" not in text_report(report)


def test_several_phases_are_a_table_in_the_text_report_and_a_list_in_the_document(report):
    several = dataclasses.replace(report, phases=PHASES)
    document = run_document(several)
    assert [(p["first_step"], p["late_rank"]) for p in document["phases"]] == [(0, None), (2, 1)]
    assert document["phases"][1]["ranks"]["1"] == {"step_ms": 61.2, "wait_ms": None}
    assert document["phases"][1]["what_if"] == ON_TIME
    text = text_report(several).splitlines()
    at = text.index("Phases (docs/definitions.md)")
    assert text.index("Verdict") < at < next(i for i, line in enumerate(text)
                                             if line.startswith("Time breakdown"))
    assert text[at + 4].split() == [
        "2-2", "1", "80.0", "61.2", "1", "60.0", "rank", "0", "60.00", "rank", "1", "on",
        "time:", "1.20", "ms", "per", "step", "(-60.00)"]


def test_the_phase_table_says_each_rank_wait_and_the_what_if():
    first, second = phase_table(PHASES).to_dict("records")
    assert pd.isna(first.pop("late_ms"))
    assert first == {"steps": "0-1", "count": 2, "share_pct": 20.0, "step_ms": 9.0,
                     "late_rank": "", "waits": "rank 0 0.10, rank 1 0.20", "what_if": ""}
    assert (second["late_rank"], second["late_ms"], second["waits"]) == ("1", 60.0,
                                                                         "rank 0 60.00")


def test_the_html_report_draws_step_time_over_the_run_with_each_phase_shaded(report):
    page = build_html("run", "/runs/x", 2, report.step_table(), report.per_rank, None, None,
                      report.ranks, [], phases=PHASES)
    section = re.search(r'<section id="phases">.*?</section>', page, re.S).group(0)
    assert "2 phases: the run changed at step(s) 2." in section
    bands = re.findall(r'<rect class="band"[^>]*><title>([^<]*)</title>', section)
    assert bands == ["steps 0-1: mean step 9.00 ms",
                     "steps 2-2: mean step 61.20 ms, rank 1 late by 60.00 ms per step"]
    assert section.count("<polyline") == 2  # rank 0, rank 1
    one = build_html("run", "/runs/x", 2, report.step_table(), report.per_rank, None, None,
                     report.ranks, [], phases=PHASES[:1])
    section = re.search(r'<section id="phases">.*?</section>', one, re.S).group(0)
    assert 'class="band"' not in section and "One phase" in section


def test_band_tooltips_are_escaped():
    svg = line_chart([("<b>", [1.0, 2.0], [1.0, 2.0])], "step", "ms",
                     bands=[(0.5, 2.5, "<script>x</script>")])
    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;" in svg
    assert "&lt;b&gt;" in svg


def test_long_runs_are_drawn_on_at_most_a_thousand_points_and_many_ranks_as_two_lines():
    rows = pd.DataFrame([{"rank": r, "step": s, "step_ns": (1e6 if s < 2000 else 61e6)}
                         for r in range(12) for s in range(1, 2101)])
    series = step_time_lines(rows)
    assert [label for label, _, _ in series] == ["median of ranks", "slowest rank"]
    steps, values = series[0][1], series[0][2]
    assert len(steps) <= MAX_DRAWN_STEPS and steps[0] == pytest.approx(2.0)
    assert values[0] == pytest.approx(1.0) and values[-1] == pytest.approx(61.0)


def test_the_diff_says_which_side_has_phases():
    assert phases_line([PHASES[:1]], [PHASES[:1]]) is None
    assert phases_line([PHASES[:1]], [PHASES]) == (
        "A: one phase; B: 2 phases, changed at step 2 (from step 2 rank 1 late by 60.00 ms per "
        "step)")
    assert phases_line([PHASES, PHASES[:1]], [[]]).startswith(
        "A: 2 phases in 1 of its 2 runs, changed at step 2")
