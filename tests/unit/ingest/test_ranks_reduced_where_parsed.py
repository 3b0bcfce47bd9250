"""Per-rank tables and summaries computed where each file is parsed (analysis.ingest.load,
analysis.rank.reduction, through analysis.run.loading): the same as from the loaded run, for the
same steps and communication kernels; every rank of a run has them, whichever way it was loaded,
and a run whose events were dropped after loading reports what a run that kept them does."""

import shutil

import pandas as pd
import pytest

from analysis.core.contracts import NotReduced, ReducedTableFailed
from analysis.ingest.load import load_path
from analysis.rank import one_rank_path as critical_path
from analysis.rank import reduction
from analysis.rank.comm.event_ops import ops_from_events
from analysis.rank.hta import _hta_rank_of, hta_temporal_breakdown
from analysis.rank.reduction import RANK_SUMMARIES, RANK_TABLES
from analysis.report import json_document
from analysis.run.analysed_run import analyse_run
from analysis.run.loading import load_run_path
from helpers.launch import DATA
from helpers.synthetic import TraceBuilder, trace_name

US = 1000
TABLES = RANK_TABLES


def rank_trace(rank: int, steps=(1, 2, 3, 4)) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=2)
    for n in steps:
        start = (n - 1) * 100
        (b.step(n, start, start + 100).compute(start + 10, start + 40)
         .nccl(start + 30, start + 60).kernel("my_exchange", start + 70, start + 80, stream=30))
    b.op("record_param_comms", 5, 6, args={
        "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0"})
    return b


def write_run(folder, builders):
    for b in builders:
        b.write(folder / trace_name(b.rank))
    return folder


def test_worker_tables_are_those_of_the_loaded_rank_with_its_steps_and_kernels(tmp_path):
    run = write_run(tmp_path / "run", [rank_trace(0), rank_trace(1)])
    loaded = load_run_path(run, "2-3", use_cache=False, jobs=2, comm_kernels=("my_exchange",))
    for trace in loaded.ranks:
        tables = trace.tables
        # Two trace files naming world size 2, and no records: neither the one-rank critical
        # path nor the collectives of a stop diagnosis can be needed.
        assert tables.critical_path is None and tables.stop_trace_ops is None
        assert tables.failed == {}
        for name, build in TABLES.items():
            pd.testing.assert_frame_equal(trace.table(name), build(trace))
        pd.testing.assert_frame_equal(tables.comm_events, RANK_SUMMARIES["comm_events"](trace))
        assert tables.event_count == len(trace.events) > 0
        for name in ("hta", "pipeline_schedule", "ddp_accumulation"):
            assert trace.table(name) == RANK_SUMMARIES[name](trace)
        per_step = tables.per_step
        assert per_step["step"].tolist() == [2, 3]
        # The custom kernel (70-80 us of each step) is communication only, as is 40-60 us.
        assert (per_step["comm_only_ns"] == 30 * US).all()


def test_the_report_is_the_same_whichever_process_reduced_the_ranks(tmp_path):
    run = write_run(tmp_path / "run", [rank_trace(0), rank_trace(1)])
    documents = [json_document.run_document(analyse_run(
        load_run_path(run, use_cache=False, jobs=jobs), "run", str(run))) for jobs in (1, 2)]
    assert json_document.dumps(documents[0]) == json_document.dumps(documents[1])
    # A run with steps and collectives, not two empty documents.
    assert [r["steps_analysed"] for r in documents[0]["ranks"]] == [[1, 2, 3, 4]] * 2
    assert documents[0]["collectives"]


def test_a_rank_of_several_profiler_windows_gets_its_tables_from_the_merged_trace(tmp_path):
    run = tmp_path / "run"
    rank_trace(0, steps=(1, 2)).write(run / trace_name(0, span=111))
    rank_trace(0, steps=(5, 6)).write(run / trace_name(0, span=222))
    loaded = load_run_path(run, use_cache=False, jobs=2)
    trace, = loaded.ranks
    # each worker saw one window only: the rank is reduced once merged
    assert trace.table("per_step")["step"].tolist() == [1, 2, 5, 6]
    report = analyse_run(loaded, "run", str(run))
    assert report.per_step["step"].tolist() == [1, 2, 5, 6]


def test_a_rank_loaded_without_the_reduction_has_no_tables_to_take(tmp_path):
    run = write_run(tmp_path / "run", [rank_trace(0)])
    trace, = load_path(run, use_cache=False).ranks
    assert trace.tables is None
    with pytest.raises(NotReduced, match="rank 0: not reduced, so it has no per_step"):
        trace.table("per_step")


def _document(loaded, run) -> str:
    return json_document.dumps(json_document.run_document(analyse_run(loaded, "run", str(run))))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_whose_events_were_dropped_reports_the_same(tmp_path, jobs):
    run = write_run(tmp_path / "run", [rank_trace(0), rank_trace(1, steps=(1, 2, 3))])
    kept = load_run_path(run, use_cache=False, jobs=jobs)
    dropped = load_run_path(run, use_cache=False, jobs=jobs, keep_events=False)
    assert all(t.events is None and t.event_count > 0 for t in dropped.ranks)
    assert _document(dropped, run) == _document(kept, run)
    # The events are read again on demand, as they were loaded.
    for held, gone in zip(kept.ranks, dropped.ranks):
        pd.testing.assert_frame_equal(gone.with_events().events, held.events)
        assert gone.events is None


def test_several_windows_of_a_rank_are_merged_and_then_dropped(tmp_path):
    run = tmp_path / "run"
    rank_trace(0, steps=(1, 2)).write(run / trace_name(0, span=111))
    rank_trace(0, steps=(5, 6)).write(run / trace_name(0, span=222))
    kept = load_run_path(run, use_cache=False, jobs=2)
    dropped = load_run_path(run, use_cache=False, jobs=2, keep_events=False)
    trace, = dropped.ranks
    assert trace.events is None and trace.table("per_step")["step"].tolist() == [1, 2, 5, 6]
    assert _document(dropped, run) == _document(kept, run)
    pd.testing.assert_frame_equal(trace.with_events().events, kept.ranks[0].events)


def test_hta_columns_of_sub_microsecond_durations_do_not_depend_on_dropping(tmp_path):
    # Whole-microsecond starts with fractional durations: HTA's float sums depend on the run's
    # earliest start, which a worker cannot know; such a rank's row is computed again from the
    # kernels its summary keeps.
    run = tmp_path / "run"
    for rank, offset in ((0, 0), (1, 3_000_001)):
        b = TraceBuilder(rank=rank, world_size=2)
        start = 1000 + offset
        b.step(1, start, start + 100).step(2, start + 100, start + 200)
        b.kernel("volta_sgemm", start + 10, start + 10.1).nccl(start + 20, start + 90.7)
        b.kernel("volta_sgemm", start + 110, start + 110.9)
        b.write(run / trace_name(rank))
    dropped = load_run_path(run, use_cache=False, jobs=2, keep_events=False)
    assert not any(t.table("hta")["exact"] for t in dropped.ranks)
    for trace in dropped.ranks:  # computed from the summaries alone: nothing is read again
        trace.read_events = None
    table = hta_temporal_breakdown(dropped.ranks)
    # HTA's rows on float64 times from the run's earliest start (rank 0's first step, 1000 us),
    # as a run whose events are all held computes them.
    kept = load_path(run, use_cache=False, jobs=1)
    names = {"ProfilerStep#1", "ProfilerStep#2"}
    expected = [_hta_rank_of(t, 1000, names, True) for t in kept.ranks]
    assert table.to_dict("records") == expected
    # Rank 1's row from its own earliest start (the worker's) differs: the test tells them apart.
    assert dropped.ranks[1].table("hta")["rows"][True] != expected[1]


def test_a_runs_one_trace_gets_its_own_critical_path_whatever_world_size_it_names(tmp_path):
    run = write_run(tmp_path / "run", [rank_trace(1)])  # rank 1 of world size 2, alone here
    dropped = load_run_path(run, use_cache=False, keep_events=False)
    kept = load_path(run, use_cache=False)
    path = dropped.ranks[0].table("critical_path")
    expected = critical_path.analyse(kept.ranks[0])
    assert len(path.critical_path_steps) == 4
    for name in ("critical_path", "critical_path_steps", "critical_path_segments"):
        pd.testing.assert_frame_equal(getattr(path, name), getattr(expected, name))
    assert path.what_if == expected.what_if
    # Two files: no rank can be the run's only one.
    two = write_run(tmp_path / "two", [rank_trace(0), rank_trace(1)])
    loaded = load_run_path(two, use_cache=False, jobs=2, keep_events=False)
    assert all(t.tables.critical_path is None for t in loaded.ranks)


def test_a_rank_without_comm_records_keeps_the_collectives_of_its_stop_diagnosis(tmp_path):
    run = shutil.copytree(DATA / "ddp_cpu", tmp_path / "run")
    (run / "rank1.comms.jsonl").unlink()
    dropped = load_run_path(run, use_cache=False, jobs=2, keep_events=False)
    kept = load_path(run, use_cache=False, jobs=2)
    with_comms, without = dropped.ranks
    assert with_comms.tables.stop_trace_ops is None
    ops = without.table("stop_trace_ops")
    trace = kept.ranks[1]
    expected = ops_from_events(trace.events, trace.all_steps, trace.all_steps, 1, 2)
    # Two buckets a step in its two profiled steps.
    assert ops["step"].tolist() == [2, 2, 3, 3] and set(ops["op"]) == {"all_reduce"}
    pd.testing.assert_frame_equal(ops, expected)


def test_a_failure_where_the_rank_is_reduced_is_kept_and_raised_where_the_table_is_taken(
        tmp_path, monkeypatch):
    def broken(trace):
        raise ValueError("no schedule")

    monkeypatch.setitem(reduction.RANK_SUMMARIES, "pipeline_schedule", broken)
    run = write_run(tmp_path / "run", [rank_trace(0)])
    dropped = load_run_path(run, use_cache=False, keep_events=False)
    trace, = dropped.ranks
    assert trace.tables.failed == {"pipeline_schedule": "ValueError: no schedule"}
    assert trace.tables.per_step is not None and trace.tables.pipeline_schedule is None
    with pytest.raises(ReducedTableFailed, match="rank 0's pipeline_schedule failed where its "
                                                 "trace was parsed: ValueError: no schedule"):
        trace.table("pipeline_schedule")
