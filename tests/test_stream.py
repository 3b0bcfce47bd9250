"""Per-rank tables computed where each file is parsed (analysis.load, analysis.run.rank_tables):
the same tables as from the loaded run, for the same steps and communication kernels."""

import pandas as pd

from analysis import communication, output
from analysis.idle import idle_gaps
from analysis.load import load_path
from analysis.run import analyse_run
from analysis.step_breakdown import breakdown_per_step
from synthetic import TraceBuilder, trace_name

US = 1000
TABLES = {"per_step": breakdown_per_step, "idle_gaps": idle_gaps,
          "comm_ops": communication.comm_ops}


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
    loaded = load_path(run, "2-3", use_cache=False, jobs=2, comm_kernels=("my_exchange",))
    for trace in loaded.ranks:
        assert set(trace.reduced) == set(TABLES)
        for name, build in TABLES.items():
            pd.testing.assert_frame_equal(trace.reduced[name], build(trace))
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
