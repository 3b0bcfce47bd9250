"""A Run computes each table on first use, with what it needs and nothing more, and each once
(analysis.run.analysed_run); its report computes every table, the same as the command's."""

import pytest

from analysis import crossrank, open_run
from analysis.rank import tables as rank_tables
from helpers.launch import DATA

RUN = DATA / "ddp_cpu"  # a 2-rank DDP run traced on CPU (tests/data/ddp_cpu/README.md)


@pytest.fixture
def passes(monkeypatch) -> dict:
    """How many times the cross-rank pass and the per-rank table ran."""
    counts = {"cross_rank": 0, "per_rank_table": 0}

    def counted(module, name):
        original = getattr(module, name)

        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, call)

    counted(crossrank, "cross_rank")
    counted(rank_tables, "per_rank_table")
    return counts


def test_the_roofline_and_hta_need_no_cross_rank_pass(passes):
    run = open_run(RUN, use_cache=False)
    assert run.hta["rank"].tolist() == [0, 1]
    assert list(run.roofline.columns)[:2] == ["rank", "name"]
    assert run.stop is None  # the run ended well
    assert passes == {"cross_rank": 0, "per_rank_table": 0}
    assert run.problems_met == [] and run.unavailable == {}


def test_the_breakdown_runs_the_cross_rank_pass_once_for_every_table_after_it(passes):
    run = open_run(RUN, use_cache=False)
    steps = run.breakdown
    assert passes == {"cross_rank": 1, "per_rank_table": 0}
    # the waits split communication: the two parts add up to it
    assert ((steps["transfer_ns"] + steps["peer_wait_ns"]) == steps["comm_only_ns"]).all()
    assert run.per_rank["rank"].tolist() == [0, 1] and run.collectives["count"].sum() == 16
    assert run.findings is not None and run.critical is not None
    assert passes == {"cross_rank": 1, "per_rank_table": 1}
    document = run.document()
    assert passes == {"cross_rank": 1, "per_rank_table": 1}
    assert document["steps"] and document["problems"] == []


def test_the_report_holds_the_tables_the_run_computed(passes):
    run = open_run(RUN, use_cache=False)
    report = run.report
    assert report.per_step is run.breakdown and report.findings is run.findings
    assert report.step_table() is run.per_step and report.cross_rank is run.cross_rank
    assert report.comm_ops is run.comm_ops and not report.nothing_analysed()
    assert passes == {"cross_rank": 1, "per_rank_table": 1}


def test_memory_is_computed_on_first_use_over_the_analysed_steps(passes):
    run = open_run(RUN, use_cache=False)
    memory = run.memory
    assert passes == {"cross_rank": 1, "per_rank_table": 0}  # the analysed steps need the waits
    assert [row["rank"] for row in memory.rows] == [0, 1]
    assert {row["measure"] for row in memory.rows} == {"rss"}
    assert [row["steps"] for row in memory.rows] == [4, 4]
    assert memory.findings == () and memory.verdict_line is None and memory.oom is None
    assert run.report.memory is memory and run.verdict.memory is None
    assert "memory" not in run.document()["verdict"]
