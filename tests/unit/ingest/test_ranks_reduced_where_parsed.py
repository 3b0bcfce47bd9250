"""Per-rank tables and summaries computed where each file is parsed (analysis.ingest.load,
analysis.rank.reduction): the same as from the loaded run, for the same steps and communication
kernels; and a run whose events were dropped after loading reports what a run that kept them
does."""

import shutil

import pandas as pd
import pytest

from analysis.ingest.load import load_path
from analysis.rank import one_rank_path as critical_path
from analysis.rank import reduction as summary
from analysis.rank.comm.event_ops import ops_from_events
from analysis.rank.hta import _hta_rank_of, hta_temporal_breakdown
from analysis.rank.reduced import FAILED, ReducedTableFailed, reduced_table
from analysis.rank.reduction import RANK_SUMMARIES, RANK_TABLES, rank_tables
from analysis.report import text_report as output
from analysis.run.analysed_run import analyse_run
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
    loaded = load_path(run, "2-3", use_cache=False, jobs=2, comm_kernels=("my_exchange",),
                       reduce_rank=rank_tables)
    for trace in loaded.ranks:
        # Two trace files naming world size 2, and no records: neither the one-rank critical
        # path nor the collectives of a stop diagnosis can be needed.
        assert set(trace.reduced) == (set(TABLES) | set(RANK_SUMMARIES)) - {"critical_path",
                                                                             "stop_trace_ops"}
        for name, build in TABLES.items():
            pd.testing.assert_frame_equal(trace.reduced[name], build(trace))
        pd.testing.assert_frame_equal(trace.reduced["comm_events"],
                                      RANK_SUMMARIES["comm_events"](trace))
        assert trace.reduced["event_count"] == len(trace.events) > 0
        for name in ("hta", "pipeline_schedule", "ddp_accumulation"):
            assert trace.reduced[name] == RANK_SUMMARIES[name](trace)
        per_step = trace.reduced["per_step"]
        assert per_step["step"].tolist() == [2, 3]
        # The custom kernel (70-80 us of each step) is communication only, as is 40-60 us.
        assert (per_step["comm_only_ns"] == 30 * US).all()


def test_the_report_is_the_same_with_or_without_the_worker_tables(tmp_path):
    run = write_run(tmp_path / "run", [rank_trace(0), rank_trace(1)])
    streamed = load_path(run, use_cache=False, jobs=2)
    computed = load_path(run, use_cache=False, jobs=2)
    for trace in computed.ranks:
        trace.reduced = {}
    documents = [output.run_document(analyse_run(loaded, "run", str(run)))
                 for loaded in (streamed, computed)]
    assert output.dumps(documents[0]) == output.dumps(documents[1])
    # A run with steps and collectives, not two empty documents.
    assert [r["steps_analysed"] for r in documents[0]["ranks"]] == [[1, 2, 3, 4]] * 2
    assert documents[0]["collectives"]


def test_a_rank_of_several_profiler_windows_gets_its_tables_from_the_merged_trace(tmp_path):
    run = tmp_path / "run"
    rank_trace(0, steps=(1, 2)).write(run / trace_name(0, span=111))
    rank_trace(0, steps=(5, 6)).write(run / trace_name(0, span=222))
    loaded = load_path(run, use_cache=False, jobs=2)
    trace, = loaded.ranks
    assert trace.reduced == {}  # each worker saw one window only
    report = analyse_run(loaded, "run", str(run))
    assert report.per_step["step"].tolist() == [1, 2, 5, 6]


def _document(loaded, run) -> str:
    return output.dumps(output.run_document(analyse_run(loaded, "run", str(run))))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_whose_events_were_dropped_reports_the_same(tmp_path, jobs):
    run = write_run(tmp_path / "run", [rank_trace(0), rank_trace(1, steps=(1, 2, 3))])
    kept = load_path(run, use_cache=False, jobs=jobs)
    dropped = load_path(run, use_cache=False, jobs=jobs, keep_events=False, reduce_rank=rank_tables)
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
    kept = load_path(run, use_cache=False, jobs=2)
    dropped = load_path(run, use_cache=False, jobs=2, keep_events=False, reduce_rank=rank_tables)
    trace, = dropped.ranks
    assert trace.events is None and trace.reduced["per_step"]["step"].tolist() == [1, 2, 5, 6]
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
    dropped = load_path(run, use_cache=False, jobs=2, keep_events=False, reduce_rank=rank_tables)
    assert not any(t.reduced["hta"]["exact"] for t in dropped.ranks)
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
    assert dropped.ranks[1].reduced["hta"]["rows"][True] != expected[1]


def test_a_runs_one_trace_gets_its_own_critical_path_whatever_world_size_it_names(tmp_path):
    run = write_run(tmp_path / "run", [rank_trace(1)])  # rank 1 of world size 2, alone here
    dropped = load_path(run, use_cache=False, keep_events=False, reduce_rank=rank_tables)
    kept = load_path(run, use_cache=False)
    path = dropped.ranks[0].reduced["critical_path"]
    expected = critical_path.analyse(kept.ranks[0])
    assert len(path["critical_path_steps"]) == 4
    for name in ("critical_path", "critical_path_steps", "critical_path_segments"):
        pd.testing.assert_frame_equal(path[name], expected[name])
    assert path["what_if"] == expected["what_if"]
    # Two files: no rank can be the run's only one.
    two = write_run(tmp_path / "two", [rank_trace(0), rank_trace(1)])
    loaded = load_path(two, use_cache=False, jobs=2, keep_events=False, reduce_rank=rank_tables)
    assert not any("critical_path" in t.reduced for t in loaded.ranks)


def test_a_rank_without_comm_records_keeps_the_collectives_of_its_stop_diagnosis(tmp_path):
    run = shutil.copytree(DATA / "ddp_cpu", tmp_path / "run")
    (run / "rank1.comms.jsonl").unlink()
    dropped = load_path(run, use_cache=False, jobs=2, keep_events=False, reduce_rank=rank_tables)
    kept = load_path(run, use_cache=False, jobs=2)
    with_comms, without = dropped.ranks
    assert "stop_trace_ops" not in with_comms.reduced
    ops = without.reduced["stop_trace_ops"]
    trace = kept.ranks[1]
    expected = ops_from_events(trace.events, trace.all_steps, trace.all_steps, 1, 2)
    # Two buckets a step in its two profiled steps.
    assert ops["step"].tolist() == [2, 2, 3, 3] and set(ops["op"]) == {"all_reduce"}
    pd.testing.assert_frame_equal(ops, expected)


def test_a_failure_where_the_rank_is_reduced_is_kept_and_raised_where_the_table_is_taken(
        tmp_path, monkeypatch):
    def broken(trace):
        raise ValueError("no schedule")

    monkeypatch.setitem(summary.RANK_SUMMARIES, "pipeline_schedule", broken)
    run = write_run(tmp_path / "run", [rank_trace(0)])
    dropped = load_path(run, use_cache=False, keep_events=False, reduce_rank=rank_tables)
    trace, = dropped.ranks
    assert trace.reduced[FAILED] == {"pipeline_schedule": "ValueError: no schedule"}
    assert "per_step" in trace.reduced
    with pytest.raises(ReducedTableFailed, match="rank 0's pipeline_schedule failed where its "
                                                 "trace was parsed: ValueError: no schedule"):
        reduced_table(trace, "pipeline_schedule", broken)
    # A rank that was never reduced has its table computed from its events.
    kept = load_path(run, use_cache=False)
    assert reduced_table(kept.ranks[0], "no such table", lambda t: len(t.events)) > 0
