"""Every number read is checked against its range (analysis.core.limits): a value out of range
is named and set aside alone; unrenamed traces are recovered; overlapping windows count once;
step records that stop early bound no step of a complete trace. The whole run folders are in
tests/integration/test_hostile_run_folders.py; these are the pieces, fast."""

import time

import msgspec
import numpy as np
import pandas as pd

from analysis.core.limits import MAX_TS_US, MAX_WORLD_SIZE, shown
from analysis.core.model import RankTrace, RunRecords
from analysis.ingest import kineto
from analysis.ingest.load import _missing_ranks, load_path
from analysis.ingest.record_checks import checked_frame, checked_manifest
from analysis.ingest.records import steps_ended
from analysis.ingest.runs import trace_files
from helpers.run_folders import gpu_trace, problems_with, write_run
from helpers.synthetic import trace_name
from tracer import schema


def test_times_out_of_range_become_zero_and_are_marked_before_any_overflow():
    ns, not_numbers, far = kineto._to_ns([1, -5, MAX_TS_US + 1, 7], MAX_TS_US)
    assert ns.tolist() == [1000, 0, 0, 7000] and not_numbers == 0
    assert far.tolist() == [False, True, True, False]
    ns, not_numbers, far = kineto._to_ns([1.5, 1e30, "soon", 10 ** 400], MAX_TS_US)
    assert ns.tolist() == [1500, 0, 0, 0] and not_numbers == 1
    assert far.tolist() == [False, True, False, True]
    assert kineto._to_ns([1, 2], MAX_TS_US)[2] is None  # in range: no mask made


def test_a_huge_value_is_shown_short_whatever_its_size():
    assert shown(10 ** 12) == "1000000000000" and shown(10 ** 30) == "1e+30"
    assert shown(10 ** 5000).startswith("an integer of ")


def _comms(**changes) -> pd.DataFrame:
    record = dict(step=1, op="send", source="p2p", pg="0", pg_size=2, dtype="float32",
                  bytes=64, start_ns=10, end_ns=20, duration_us=0.01, timing="host",
                  algbw_gbps=1.0, busbw_gbps=1.0, peer=1, async_op=False, position=0,
                  failed=False)
    return pd.DataFrame([record, {**record, **changes}])


def test_a_required_value_out_of_range_sets_its_record_aside():
    frame, problems = checked_frame(_comms(bytes=-1), schema.CommRecord, "c.jsonl", 0, 2)
    assert len(frame) == 1 and frame["bytes"].tolist() == [64]
    assert problems == ["c.jsonl: rank 0: 1 comm records have 'bytes' out of range (first -1, "
                        f"outside 0..{1 << 50}); those records are set aside"]


def test_an_optional_value_out_of_range_is_set_aside_alone_and_sizes_meet_the_world():
    frame, problems = checked_frame(_comms(peer=10 ** 30), schema.CommRecord, "c.jsonl", 0, 2)
    assert len(frame) == 2 and frame["peer"].tolist()[0] == 1 and np.isnan(frame["peer"][1])
    assert "'peer' out of range (first 1e+30, outside 0..1); the value is set aside" in problems[0]
    frame, problems = checked_frame(_comms(pg_size=3), schema.CommRecord, "c.jsonl", 0, 2)
    assert len(frame) == 1 and "'pg_size' out of range (first 3, outside 1..2)" in problems[0]


def test_a_steps_cpu_time_out_of_range_is_set_aside_and_the_step_kept():
    steps = pd.DataFrame([msgspec.structs.asdict(schema.StepRecord(
        step=s, start_ns=10 * s, end_ns=10 * s + 10, cpu_ns=cpu)) for s, cpu in ((1, 5), (2, -3))])
    frame, problems = checked_frame(steps, schema.StepRecord, "s.jsonl", 1, 2)
    assert frame["step"].tolist() == [1, 2] and frame["cpu_ns"].tolist()[0] == 5
    assert np.isnan(frame["cpu_ns"].tolist()[1])
    assert problems == ["s.jsonl: rank 1: 1 step records have 'cpu_ns' out of range (first -3, "
                        f"outside 0..{10 ** 15}); the value is set aside"]


def test_a_record_that_ends_before_it_starts_is_set_aside_to_the_nanosecond():
    start = 1_796_044_274_546_271_709  # float64 would round both times to one
    frame, problems = checked_frame(_comms(start_ns=start, end_ns=start - 1),
                                    schema.CommRecord, "c.jsonl", 0, 2)
    assert len(frame) == 1 and "end before they start" in problems[0]


def test_a_manifest_value_out_of_range_is_set_aside_and_a_clock_sync_with_it_whole():
    start = schema.RunStart(schema_version=1, run_name="r", rank=1, local_rank=1,
                            world_size=10 ** 12, host="h", pid=1, start_ns=0, argv=[],
                            script="s.py", script_args=[], torch_version="x", config={})
    sync = schema.ClockSync(rank=1, offset_ns=10 ** 30, uncertainty_ns=0, round_trips=1)
    kept, problems = checked_manifest([start, sync], "m.jsonl", 1)
    assert kept == [start] and start.world_size is None
    assert problems[0] == (f"m.jsonl: rank 1: run_start world_size 1000000000000 is out of "
                           f"range (1..{MAX_WORLD_SIZE}); set aside")
    assert "clock_sync offset_ns 1e+30" in problems[1] and "record is set aside" in problems[1]


def _rank(rank: int) -> RankTrace:
    return RankTrace(rank=rank, world_size=None, path=None, events=None, steps=None,
                     records=None, problems=[])


def test_missing_ranks_are_counted_from_the_ranks_found_even_for_the_largest_world():
    started = time.perf_counter()
    problems = _missing_ranks("run", [_rank(0), _rank(1)], MAX_WORLD_SIZE)
    assert time.perf_counter() - started < 0.1
    assert problems == [f"run: ranks 2-{MAX_WORLD_SIZE - 1} of world size {MAX_WORLD_SIZE} have "
                        f"no trace here (2 of {MAX_WORLD_SIZE} ranks analysed)"]
    assert _missing_ranks("run", [_rank(0), _rank(3)], 5) == [
        "run: ranks 1-2, 4 of world size 5 have no trace here (2 of 5 ranks analysed)"]
    assert _missing_ranks("run", [_rank(0), _rank(1)], 2) == []


def test_an_unrenamed_trace_is_taken_only_where_the_renamed_one_is_missing(tmp_path):
    for name in ("rank0.1.pt.trace.json.gz", "rank0.1.pt.trace.json.gz.raw.tmp",
                 "rank1.2.pt.trace.json.gz.tmp", "rank1.2.pt.trace.json.gz.raw.tmp",
                 "rank2.3.pt.trace.json.gz.raw.tmp.tmp", "rank0.steps.jsonl.tmp"):
        (tmp_path / name).write_bytes(b"{}")
    assert [p.name for p in trace_files(tmp_path)] == [
        "rank0.1.pt.trace.json.gz", "rank1.2.pt.trace.json.gz.raw.tmp",
        "rank2.3.pt.trace.json.gz.raw.tmp.tmp"]


def test_a_copied_window_of_a_rank_is_counted_once_and_named(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0, world_size=1)])
    (run / trace_name(0, span=2)).write_bytes((run / trace_name(0)).read_bytes())
    alone = load_path(write_run(tmp_path / "alone", [gpu_trace(rank=0, world_size=1)]),
                      use_cache=False).ranks[0]
    twice = load_path(run, use_cache=False)
    assert len(twice.ranks[0].events) == len(alone.events)
    assert problems_with(twice, trace_name(0, span=2), "rank 0", "overlaps", "steps 1-3",
                         "counted once")


def _records(steps: list[int], manifest: list) -> RunRecords:
    frame = pd.DataFrame({"step": steps})
    return RunRecords(comms=frame, samples=frame, steps=frame, manifest=manifest)


def test_step_records_bound_the_trace_s_steps_only_when_complete():
    start = schema.RunStart(schema_version=1, run_name="r", rank=0, local_rank=0, world_size=1,
                            host="h", pid=1, start_ns=0, argv=[], script="s.py",
                            script_args=[], torch_version="x", config={})

    def end(steps):
        return schema.RunEnd(rank=0, end_ns=1, status="ok", exit_code=0, steps=steps,
                             windows=1, samples=0, comm_ops=0, bytes_written=0, errors=0)

    assert steps_ended(_records([0, 1, 2], [start, end(3)])).last == 2
    lost = steps_ended(_records([0], [start, end(3)]))  # the run_end counts more
    assert (lost.last, lost.cut_short) == (2, False) and "run_end counts 3" in lost.said_by
    died = steps_ended(_records([0], [start]))  # no run_end: the records were cut short
    assert (died.last, died.cut_short) == (0, True)
    assert steps_ended(_records([], [])) is None
