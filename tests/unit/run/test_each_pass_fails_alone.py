"""Each pass of the run-wide analysis fails alone: the cross-rank pass's straggler and pipeline
passes each give one problem line and an empty frame, and the rest of the cross-rank frames and
of the report stand (analysis.crossrank.analyse, analysis.run)."""

import pytest

from analysis import crossrank
from analysis.run.analysed_run import analyse_run
from analysis.run.loading import load_run_path
from helpers.pipeline_run import pipeline_run


def _report(folder):
    return analyse_run(load_run_path(folder, use_cache=False), name=folder.name, path=str(folder))


def test_the_pipeline_run_has_its_bubbles_when_nothing_fails(tmp_path):
    report = _report(pipeline_run(tmp_path / "run"))
    assert report.problems == []
    assert report.cross_rank.pipeline["rank"].tolist() == [0, 1]


@pytest.mark.parametrize("name, function", [("pipeline", "pipeline_bubbles"),
                                            ("stragglers", "find_stragglers")])
def test_a_failing_cross_rank_pass_is_one_problem_and_the_other_passes_stand(
        tmp_path, monkeypatch, name, function):
    def broken(*args, **kwargs):
        raise ValueError("attempt to get argmax of an empty sequence")

    monkeypatch.setattr(crossrank, function, broken)
    report = _report(pipeline_run(tmp_path / "run"))
    assert report.problems == [
        f"cross-rank {name} analysis failed (ValueError: attempt to get argmax of an empty "
        f"sequence); the rest of the cross-rank analysis stands"]
    assert report.unavailable == {
        f"cross_rank_{name}": "ValueError: attempt to get argmax of an empty sequence"}
    cross = report.cross_rank
    assert getattr(cross, name).empty and len(cross.waits) and len(cross.clock)
    other = "stragglers" if name == "pipeline" else "pipeline"
    assert getattr(cross, other) is not None and report.findings is not None
