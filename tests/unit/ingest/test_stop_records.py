"""What the stop diagnosis reads of a run folder (analysis.ingest.stop_records): each rank's
main-thread frames from its stack dumps, innermost first, from the dump where it stopped, with
where the script called into a library; and everything a run folder holds for it."""

from __future__ import annotations

import pandas as pd

from analysis.findings import stop_diagnosis as stop
from analysis.ingest import stop_records
from analysis.ingest.stop_records import stop_inputs
from analysis.run.loading import load_run_path
from helpers.run_folders import write_killed_rank
from helpers.tracer_files import stack_dump
from tracer import schema


def test_a_rank_stuck_inside_a_library_shows_where_the_script_called_it():
    torch_dir = "/v/lib/python3.11/site-packages/torch/"
    main = [schema.StackFrame(file="<frozen runpy>", line=88, function="_run_code"),
            schema.StackFrame(file="/x/train.py", line=85, function="train"),
            schema.StackFrame(file="/x/helpers.py", line=7, function="step")] + [
        schema.StackFrame(file=torch_dir + name, line=line, function="backward")
        for name, line in (("_tensor.py", 623), ("autograd/__init__.py", 395),
                           ("autograd/graph.py", 979))]
    dump = schema.StackDump(rank=0, t_ns=0, reason="exception", pending=[], threads=[
        schema.ThreadStack(name="MainThread", thread_id=1, main=True, frames=main)])
    found = stop_records.dump_frames([dump], 0)
    assert [(f["depth"], f["file"], f["line"]) for f in found] == [
        (0, torch_dir + "autograd/graph.py", 979), (1, torch_dir + "autograd/__init__.py", 395),
        (2, torch_dir + "_tensor.py", 623), (3, "/x/helpers.py", 7)]
    text = stop.rank_text(0, "failed", pd.DataFrame(found))
    assert text.endswith(", called from backward at torch/_tensor.py:623, called from step at "
                         "/x/helpers.py:7 (exception)")
    gap = pd.DataFrame(found).drop(index=2)
    assert ", ... called from step at /x/helpers.py:7" in stop.rank_text(0, "failed", gap)


def test_the_first_dump_at_a_stop_gives_the_innermost_frames_first():
    dumps = [stack_dump("sigusr1", "earlier", 40, 0), stack_dump("exception", "wait_here", 45, 1),
             stack_dump("sigterm", "on_the_way_out", 47, 2), stack_dump("sigusr1", "later", 50, 3)]
    found = stop_records.dump_frames(dumps, 1)
    assert [(f["depth"], f["function"], f["line"]) for f in found] == [
        (0, "wait_here", 45), (1, "<module>", 10)]
    assert stop_records.dump_frames([dumps[0], dumps[3]], 1)[0]["function"] == "later"
    text = stop.rank_text(1, "interrupted", pd.DataFrame(found))
    assert text == ("rank 1 (interrupted) was in wait_here at /x/train.py:45, called from "
                    "<module> at /x/train.py:10 (exception)")


def test_the_inputs_of_a_killed_run_are_its_records_statuses_and_no_frames(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        write_killed_rank(run, rank, steps=3)
    inputs = stop_inputs(load_run_path(run, use_cache=False))
    assert dict(inputs.statuses) == {0: schema.STATUS_NO_END, 1: schema.STATUS_NO_END}
    assert inputs.world_size == 2 and inputs.problems == []
    # each rank's one comm record (step 0's all-reduce), no issue record, no stack dump
    assert inputs.completed["rank"].tolist() == [0, 1] and inputs.issued.empty
    assert inputs.frames.empty and list(inputs.frames.columns) == stop_records.FRAME_COLUMNS
    assert dict(inputs.exceptions) == {}
