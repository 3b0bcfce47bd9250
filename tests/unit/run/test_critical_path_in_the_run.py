"""The critical path and what-if answers wired into a run's analysis (analysis.run): the path of
every analysed step by rank and category, the what-if answers, the verdict quoting the top one,
the JSON document's `critical_path` and `what_if`, and a failing model that is one problem.
A hand-built run whose answers are known exactly (docs/critical-path.md)."""

from pathlib import Path

import pytest

from analysis.crossrank import critical_path
from analysis.report.csv_files import csv_tables
from analysis.report.json_document import run_document
from analysis.report.text_report import text_report
from analysis.run.analysed_run import analyse_run
from analysis.run.loading import load_run_path
from helpers.late_rank_run import late_rank_run
from helpers.launch import DATA


def _report(folder: Path):
    return analyse_run(load_run_path(folder, use_cache=False), name=folder.name, path=str(folder))


def test_the_run_has_the_critical_path_of_every_step_by_rank_and_category(tmp_path):
    report = _report(late_rank_run(tmp_path / "run"))
    assert report.problems == []
    steps = report.critical.critical_path_steps
    assert steps["step"].tolist() == [1, 2, 3]
    assert steps["path_ms"].tolist() == pytest.approx([1.0] * 3)
    path = report.critical.critical_path
    step_1 = {(r.rank, r.category): r.ms for r in path[path["step"] == 1].itertuples()}
    # rank 1's work up to its late issue, the transfer after it, rank 0's work to its step end
    assert step_1 == pytest.approx({(1, "compute"): 0.59, (0, "transfer"): 0.11,
                                    (0, "compute"): 0.30})


def test_the_top_what_if_is_the_late_rank_on_time_and_the_verdict_quotes_it(tmp_path):
    report = _report(late_rank_run(tmp_path / "run"))
    top = report.critical.what_if[0]
    assert top["change"] == "rank 1 on time" and top["ranks"] == [1]
    # rank 1 issues at 100 us as rank 0 does: every step end 490 us earlier
    assert top["saved_ms_per_step"] == pytest.approx(0.49)
    assert top["predicted_step_ms"] == pytest.approx(0.51)
    assert report.verdict.what_if == ("if rank 1 were on time: 0.51 ms per step instead of "
                                         "1.00 (-49%) over the 3 steps of the critical path "
                                         "(docs/critical-path.md).")
    text = text_report(report)
    assert f"  What if: {report.verdict.what_if}" in text.splitlines()
    assert "Critical path per step" in text and "rank 1 compute 0.59" in text


def test_the_document_carries_the_path_and_the_answers(tmp_path):
    report = _report(late_rank_run(tmp_path / "run"))
    document = run_document(report)
    first = document["critical_path"][0]
    assert (first["step"], first["path_ms"], first["end_rank"]) == (1, pytest.approx(1.0), 0)
    assert {(p["rank"], p["category"]): p["ms"] for p in first["by_rank"]} == pytest.approx(
        {(1, "compute"): 0.59, (0, "transfer"): 0.11, (0, "compute"): 0.30})
    assert [w["change"] for w in document["what_if"]][0] == "rank 1 on time"
    assert list(document["what_if"][0]) == ["change", "kind", "ranks", "saved_ms_per_step",
                                            "predicted_step_ms", "assumptions"]
    tables = csv_tables(report)
    assert tables["what_if"]["change"].iloc[0] == "rank 1 on time"
    assert len(tables["critical_path_steps"]) == 3


def test_a_failing_model_is_one_problem_and_the_report_stands(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("no step end")

    monkeypatch.setattr(critical_path, "analyse", broken)
    report = _report(late_rank_run(tmp_path / "run"))
    assert report.problems == ["critical path analysis failed (ValueError: no step end); no "
                               "what-if answer"]
    assert report.critical is None and report.verdict.what_if is None
    document = run_document(report)
    assert document["critical_path"] is None and document["what_if"] == []
    assert document["cross_rank"] is not None and document["bottlenecks"]


def test_the_html_page_marks_the_path_in_the_gantt_and_lists_the_answers(tmp_path):
    from analysis.report.html.page import path_ranks, write_html_report

    report = _report(late_rank_run(tmp_path / "run"))
    assert path_ranks(report.critical, 1) == {0: "compute 0.30 ms, transfer 0.11 ms",
                                              1: "compute 0.59 ms"}
    write_html_report(report, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert '<section id="critical"><h2>Critical path and what-if</h2>' in page
    # both ranks are on every step's path: both Gantt rows marked
    # three steps of equal time: slowest (3), median (2) and fastest (1) each drawn
    assert page.count('text-anchor="end">rank 1 \u25c6</text>') == 3
    assert "rank 0: compute 0.30 ms, transfer 0.11 ms; rank 1: compute 0.59 ms" in page
    assert '<td class="text">rank 1 on time</td>' in page


def test_set_up_collectives_are_written_apart_and_the_cross_rank_notes_are_in_the_document_once(
        tmp_path):
    report = _report(late_rank_run(tmp_path / "run", setup=True))
    setup = report.setup_collectives
    assert setup[["op", "count", "total_us"]].values.tolist() == [["broadcast", 2, 800.0]]
    assert report.collectives["op"].tolist() == ["all_reduce"]
    # the set-up broadcast is on no step's path: the same answers as without it
    assert report.critical.what_if[0]["saved_ms_per_step"] == pytest.approx(0.49)
    document = run_document(report)
    assert [(c["op"], c["count"]) for c in document["setup_collectives"]] == [("broadcast", 2)]
    assert document["collectives"][0]["ms_per_step"] == pytest.approx(
        report.collectives["ms_per_step"].iloc[0])
    # rank 1 last in all 3 steps: too few to name it late, which the pass says in a note, in
    # the document's notes (once: the cross_rank object does not repeat it)
    assert [n["note"] for n in document["notes"]] == ["too few steps to name rank 1 late"]
    assert "notes" not in document["cross_rank"]
    assert "setup_collectives" in csv_tables(report)
    text = text_report(report).splitlines()
    at = text.index("Set-up collectives (before the first step; in no step's time)")
    assert text[at + 2].split()[:2] == ["broadcast", "ddp"]


def test_the_paths_of_a_real_runs_steps_add_up_to_its_time():
    # ddp_gloo: 2 ranks on CPU, the cross-rank path of every recorded step. Each step's path
    # begins where the previous one's ended: over the analysed steps (consecutive) the paths
    # add up to the time from the first one's beginning to the last one's end.
    report = _report(DATA / "ddp_gloo")
    steps = report.critical.critical_path_steps
    numbers = steps["step"].tolist()
    assert len(numbers) > 5 and numbers == list(range(numbers[0], numbers[-1] + 1))
    segments = report.critical.critical_path_segments
    elapsed = (segments["end_ns"].max() - segments["start_ns"].min()) / 1e6
    assert steps["path_ms"].sum() == pytest.approx(elapsed, rel=0.01)
    # After the profiler's window (steps 7-9) rank 1 starts step 10 late: step 10's path holds
    # that wait as the time between its steps, not as compute.
    step_10 = report.critical.critical_path.query("step == 10").groupby("category")["ms"].sum()
    assert step_10["between_steps"] > 60
