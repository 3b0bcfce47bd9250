"""`analysis.open_run`, the notebook front, and the module graph behind the command line."""

import json
import re
from pathlib import Path

import pytest

import analysis
from analysis import breakdown as cli
from analysis.ingest.records import RECORD_FILES, record_ranks
from analysis.ingest.runs import NothingToAnalyse
from analysis.rank import step_breakdown as breakdown
from analysis.rank import tables as ranks
from analysis.rank.layers import PARTS
from helpers.launch import DATA
from tracer import schema

RUN = DATA / "ddp_cpu"  # a 2-rank DDP run traced on CPU (tests/data/ddp_cpu/README.md)


def test_open_run_gives_the_tables_of_the_json_document(capsys):
    run = analysis.open_run(RUN, use_cache=False)
    assert [t.rank for t in run.ranks] == [0, 1] and run.problems == []
    assert cli.main([str(RUN), "--format", "json", "--no-cache"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert run.document() == printed
    steps = run.breakdown
    assert steps[["rank", "step"]].values.tolist() == [[0, 2], [0, 3], [1, 2], [1, 3]]
    assert (steps[PARTS].sum(axis=1) == steps["step_ns"]).all()
    assert run.per_step["step_ns"].tolist() == [s["step_ns"] for s in printed["steps"]]
    assert run.totals["step_ns"].tolist() == [r["breakdown"]["step_ns"] for r in printed["ranks"]]
    # 10 comm records a rank, 2 of them set-up (step 0: DDP's first broadcast and
    # all-reduce), kept apart from the 8 of the analysed steps; the findings are the document's
    assert len(run.comm_ops) == 16 and run.collectives["count"].sum() == 16
    assert run.setup_collectives[["op", "count"]].values.tolist() == [["all_reduce", 2],
                                                                      ["broadcast", 2]]
    assert (run.comm_ops["step"] >= 1).all()
    # Waiting for peers is split out of communication: the two parts add up to it.
    split = steps["transfer_ns"] + steps["peer_wait_ns"]
    assert (split == steps["comm_only_ns"]).all() and (steps["peer_wait_ns"] > 0).any()
    assert run.findings["finding"].tolist() == [b["finding"] for b in printed["bottlenecks"]]
    assert run.per_rank["rank"].tolist() == [0, 1]
    gaps = run.idle_gaps
    assert gaps["dur_ns"].sum() == steps["idle_ns"].sum()
    assert run.idle["total_ns"].sum() == gaps["dur_ns"].sum()
    assert run.hta["kernel_time_us"].isna().all()  # a CPU trace: HTA has no kernels


def test_open_run_without_events_gives_the_same_document():
    held = analysis.open_run(RUN, use_cache=False)
    reduced = analysis.open_run(RUN, use_cache=False, keep_events=False)
    assert [t.events is None for t in reduced.ranks] == [True, True]
    assert reduced.document() == held.document()
    assert len(reduced.ranks[0].with_events().events) == len(held.ranks[0].events) > 0


def test_open_run_selects_steps_and_names_what_is_missing():
    run = analysis.open_run(RUN, "3", use_cache=False)
    assert run.breakdown["step"].tolist() == [3, 3]
    with pytest.raises(ValueError, match="ends before it starts"):
        analysis.open_run(RUN, "3-2", use_cache=False)
    with pytest.raises(NothingToAnalyse, match="no such file or folder"):
        analysis.open_run(RUN / "absent")


def test_one_list_of_breakdown_columns():
    assert breakdown.BREAKDOWN_NS_COLUMNS == ["step_ns", *PARTS, "exposed_comm_ns"]
    assert not hasattr(ranks, "BREAKDOWN_COLUMNS")  # one list: breakdown's
    assert breakdown.BREAKDOWN_COLUMNS[2:2 + len(breakdown.BREAKDOWN_NS_COLUMNS)] == \
        breakdown.BREAKDOWN_NS_COLUMNS
    per_step = breakdown.empty_breakdown()
    assert list(per_step.columns) == breakdown.BREAKDOWN_COLUMNS
    assert list(ranks.per_step_table(per_step, []).columns)[:11] == [
        "rank", "step", *breakdown.BREAKDOWN_NS_COLUMNS, "overlap_pct", "kind"]


def test_record_files_are_the_schemas_own(tmp_path):
    assert set(RECORD_FILES) == {schema.MANIFEST_FILE, schema.COMMS_FILE, schema.SAMPLES_FILE,
                                 schema.STEPS_FILE}
    for rank, pattern in enumerate(RECORD_FILES):
        (tmp_path / pattern.format(rank=rank + 10)).write_text("")
    (tmp_path / (schema.COMMS_FILE.format(rank=7) + schema.TEMP_SUFFIX)).write_text("")
    (tmp_path / schema.MEMORY_SNAPSHOT_FILE.format(rank=3, step=1)).write_text("")
    (tmp_path / schema.kineto_trace_file(4, 123)).write_text("")
    (tmp_path / (schema.STEPS_FILE.format(rank=5) + ".bak")).write_text("")
    assert record_ranks(tmp_path) == {7, 10, 11, 12, 13}


def test_the_analysis_imports_its_modules_statically():
    sources = sorted((Path(analysis.__file__).parent).rglob("*.py"))
    assert len(sources) > 10
    dynamic = [p.name for p in sources if re.search(r"import_module|__import__", p.read_text())]
    assert dynamic == []
