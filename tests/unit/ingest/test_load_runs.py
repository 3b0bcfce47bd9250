"""Reading traces and records: columns, ranks, steps, the cache, and every kind of bad input."""

import json
import os

import pandas as pd
import pytest

from analysis.core.event_kinds import EVENT_COLUMNS
from analysis.core.model import UNKNOWN_RANK
from analysis.core.step_spec import parse_step_spec
from analysis.ingest import cache, load
from analysis.ingest.load import load_path
from analysis.ingest.runs import CACHE_DIR, NothingToAnalyse, resolve_runs
from helpers.run_folders import (
    gpu_trace,
    problems_with,
    write_killed_rank,
    write_records,
    write_run,
)
from helpers.synthetic import TraceBuilder, trace_name
from tracer import schema


# ---- events frame -----------------------------------------------------------------------------
def test_events_frame_has_the_interface_columns_and_values(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace()])
    trace = load_path(run, use_cache=False).ranks[0]
    events = trace.events
    assert list(events.columns) == EVENT_COLUMNS
    kernels = events[events["is_gpu"]]
    assert set(kernels["cat"]) == {"kernel"} and (kernels["stream"] >= 0).all()
    assert (events.loc[~events["is_gpu"], "stream"] == -1).all()
    nccl = kernels[kernels["name"].astype(str).str.startswith("nccl")]
    assert nccl["is_comm"].all() and not kernels.drop(nccl.index)["is_comm"].any()
    first = nccl.iloc[0]
    assert (first["ts_ns"], first["dur_ns"], first["end_ns"]) == (30_000, 30_000, 60_000)
    call = events[events["name"] == "record_param_comms"].iloc[0]
    assert call["is_comm"] and call["collective"] == "allreduce"
    assert (call["in_nelems"], call["group_size"], call["comm_dtype"], call["pg_name"]) == (
        1024.0, 2.0, "Float", "0")
    gloo = events[events["name"] == "gloo:all_reduce"].iloc[0]
    assert json.loads(gloo["input_dims"]) == [[1024]]
    assert json.loads(gloo["input_type"]) == ["float"]
    assert gloo["tid"] == "2" and gloo["pid"] == "100"
    # GPU-side copies of annotations and step spans never count as communication or steps
    assert trace.steps["step"].tolist() == [1, 2, 3]
    assert trace.steps["start_ns"].tolist() == [0, 100_000, 200_000]


def test_legacy_category_names_are_normalised(tmp_path):
    doc = TraceBuilder().step(1, 0, 10).compute(1, 2).memcpy(3, 4).document()
    for event in doc["traceEvents"]:
        event["cat"] = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "cpu_op": "Operator",
                        "user_annotation": "Operator", "cuda_runtime": "Runtime"}.get(
            event.get("cat"), event.get("cat"))
    (tmp_path / "old.json").write_text(json.dumps(doc))
    events = load_path(tmp_path / "old.json", use_cache=False).ranks[0].events
    assert set(events["cat"]) == {"cpu_op", "kernel", "gpu_memcpy", "cuda_runtime"}
    assert events["is_gpu"].sum() == 2


def test_odd_values_are_tolerated(tmp_path):
    doc = TraceBuilder().step(1, 0, 10).compute(1, 2).document()
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cpu_op", "name": "weird", "pid": "host", "tid": "thread x",
         "ts": 3.5, "dur": "oops"},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 4, "dur": 1,
         "args": {"stream": "0x0", "correlation": "12"}},
        {"ph": "i", "name": "instant", "pid": 1, "tid": 1, "ts": 5},
    ]
    (tmp_path / "odd.json").write_text(json.dumps(doc))
    result = load_path(tmp_path / "odd.json", use_cache=False)
    events = result.ranks[0].events
    weird = events[events["name"] == "weird"].iloc[0]
    assert weird["dur_ns"] == 0 and weird["tid"] == "thread x" and weird["ts_ns"] == 3500
    k = events[events["name"] == "k"].iloc[0]
    assert (k["stream"], k["correlation"]) == (-1, 12)  # int() semantics, as HTA
    assert problems_with(result, "odd.json", "non-numeric 'dur'")
    assert "instant" not in set(events["name"])


# ---- ranks ----------------------------------------------------------------------------------
def test_ranks_come_from_distributed_info_and_missing_ranks_are_named(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=r, world_size=4) for r in (0, 1)])
    result = load_path(run, use_cache=False)
    assert [t.rank for t in result.ranks] == [0, 1]
    assert result.world_size == 4
    assert problems_with(result, "ranks 2-3 of world size 4")


def test_duplicate_ranks_name_both_files_and_the_first_is_analysed(tmp_path):
    run = tmp_path / "run"
    gpu_trace(rank=0).write(run / "a.json.gz")
    gpu_trace(rank=0).write(run / "b.json.gz")
    gpu_trace(rank=1).write(run / "c.json.gz")
    result = load_path(run, use_cache=False)
    duplicate = problems_with(result, "duplicate rank 0")
    assert duplicate
    assert str(run / "a.json.gz") in duplicate[0] and str(run / "b.json.gz") in duplicate[0]
    assert [(t.rank, t.path.name) for t in result.ranks] == [(0, "a.json.gz"), (1, "c.json.gz")]


def test_a_lone_trace_without_rank_is_rank_zero_with_a_warning(tmp_path):
    TraceBuilder(distributed_info=False).step(1, 0, 10).compute(1, 2).write(tmp_path / "x.json")
    result = load_path(tmp_path / "x.json", use_cache=False)
    assert result.ranks[0].rank == 0
    assert problems_with(result, "x.json", "no rank in distributedInfo")


def test_several_traces_without_rank_are_each_analysed_unranked(tmp_path):
    for name in ("x.json", "y.json"):
        TraceBuilder(distributed_info=False).step(1, 0, 10).write(tmp_path / "run" / name)
    result = load_path(tmp_path / "run", use_cache=False)
    assert [t.rank for t in result.ranks] == [UNKNOWN_RANK, UNKNOWN_RANK]
    assert len(problems_with(result, "no rank in distributedInfo")) == 2


def test_profiler_windows_of_one_rank_are_merged(tmp_path):
    run = tmp_path / "run"
    gpu_trace(rank=0, steps=(1, 2)).write(run / trace_name(0, span=111))
    gpu_trace(rank=0, steps=(5, 6)).write(run / trace_name(0, span=222))
    result = load_path(run, use_cache=False)
    assert len(result.ranks) == 1
    trace = result.ranks[0]
    assert trace.steps["step"].tolist() == [1, 2, 5, 6]
    assert [p.name for p in trace.extra_paths] == [trace_name(0, span=222)]
    assert not problems_with(result, "duplicate")


def test_files_are_parsed_in_parallel_processes_with_the_same_result(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=r) for r in (0, 1)])
    serial = load_path(run, use_cache=False, jobs=1)
    parallel = load_path(run, use_cache=False, jobs=2)
    for a, b in zip(serial.ranks, parallel.ranks):
        pd.testing.assert_frame_equal(a.events, b.events)
        pd.testing.assert_frame_equal(a.steps, b.steps)


# ---- steps ------------------------------------------------------------------------------------
def test_step_spec():
    assert parse_step_spec("3-5,7") == [3, 4, 5, 7]
    assert parse_step_spec(" 2 , 2-3") == [2, 3]
    for bad in ("a", "5-3", ",", "1-"):
        with pytest.raises(ValueError):
            parse_step_spec(bad)


def test_step_selection_and_hta_selection(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(steps=(1, 2, 3, 4))])
    assert load_path(run, use_cache=False).ranks[0].steps["step"].tolist() == [1, 2, 3, 4]
    assert load_path(run, "2-3", use_cache=False).ranks[0].steps["step"].tolist() == [2, 3]
    hta = load_path(run, use_cache=False, hta_compatible=True).ranks[0]
    assert hta.steps["step"].tolist() == [1, 2, 3]
    missing = load_path(run, [4, 9], use_cache=False)
    assert missing.ranks[0].steps["step"].tolist() == [4]
    assert problems_with(missing, "step 9 is not in the trace (it has 1-4)")


# ---- bad input --------------------------------------------------------------------------------
def test_truncated_gzip_is_named_and_the_other_ranks_still_load(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0), gpu_trace(rank=1)])
    broken = run / trace_name(1)
    broken.write_bytes(broken.read_bytes()[:-200])
    result = load_path(run, use_cache=False)
    assert [t.rank for t in result.ranks] == [0]
    assert problems_with(result, str(broken), "truncated or corrupt gzip")
    assert problems_with(result, "rank 1 of world size 2 has no trace")


def test_invalid_json_is_named(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    (run / "rank1.2.pt.trace.json").write_text('{"traceEvents": [{"ph": "X",')
    result = load_path(run, use_cache=False)
    assert problems_with(result, "rank1.2.pt.trace.json", "invalid JSON")
    assert [t.rank for t in result.ranks] == [0]


def test_json_without_trace_events_is_named(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "other.json").write_text('{"hello": 1}')
    gpu_trace(rank=0, world_size=1).write(tmp_path / "run" / "good.json")
    result = load_path(tmp_path / "run", use_cache=False)
    assert problems_with(result, "other.json", "no 'traceEvents'")
    assert [t.path.name for t in result.ranks] == ["good.json"]


def test_json_of_the_wrong_shape_is_named(tmp_path):
    (tmp_path / "list.json").write_text('[1, 2]')
    result = load.load_files([tmp_path / "list.json"], options=load.LoadOptions(use_cache=False))
    assert result.ranks == [] and problems_with(result, "list.json", "not a Kineto trace")


def test_empty_folder_and_missing_path(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(NothingToAnalyse, match="empty.*no Kineto trace"):
        resolve_runs([tmp_path / "empty"])
    with pytest.raises(NothingToAnalyse, match="no such file"):
        resolve_runs([tmp_path / "nope"])


def test_trace_without_device_events_is_a_cpu_trace(tmp_path):
    TraceBuilder(backend="gloo").step(1, 0, 10).op("aten::mm", 1, 5).write(tmp_path / "c.json")
    trace = load_path(tmp_path / "c.json", use_cache=False).ranks[0]
    assert not trace.events["is_gpu"].any()


# ---- folders of runs ------------------------------------------------------------------------
def test_folder_of_runs_newest_by_default_or_by_name_or_all(tmp_path):
    old = write_run(tmp_path / "runs" / "old", [gpu_trace(rank=0, world_size=1)])
    new = write_run(tmp_path / "runs" / "new", [gpu_trace(rank=0, world_size=1)])
    os.utime(old / trace_name(0), (1_000_000, 1_000_000))
    assert [r for r, _ in resolve_runs([tmp_path / "runs"])] == [new]
    assert [r for r, _ in resolve_runs([tmp_path / "runs"], run="old")] == [old]
    assert [r for r, _ in resolve_runs([tmp_path / "runs"], all_runs=True)] == [old, new]
    with pytest.raises(NothingToAnalyse, match="no run named 'x'"):
        resolve_runs([tmp_path / "runs"], run="x")


# ---- cache ------------------------------------------------------------------------------------
def test_cache_round_trip_and_invalidation(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace()])
    path = run / trace_name(0)
    cold = cache.read_trace(path)
    cache_file = run / CACHE_DIR / (path.name + ".parquet")
    assert cache_file.is_file()
    warm = cache.read_cache(path)
    assert warm is not None
    pd.testing.assert_frame_equal(warm.events, cold.events, check_categorical=False)
    pd.testing.assert_frame_equal(warm.steps, cold.steps)
    assert (warm.rank, warm.world_size, warm.float_timestamps) == (0, 2, False)
    # A changed trace (new size and mtime) is parsed again, not served from the cache.
    gpu_trace(steps=(1, 2)).write(path)
    assert cache.read_trace(path).steps["step"].tolist() == [1, 2]


def test_unwritable_cache_folder_falls_back_silently(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(world_size=1)])
    (run / CACHE_DIR).write_text("a file where the cache folder would go")
    result = load_path(run)
    assert [t.rank for t in result.ranks] == [0] and result.problems == []


# ---- ranktrace records ------------------------------------------------------------------------


def test_records_are_attached_and_a_truncated_tmp_file_is_read(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    write_records(run, 0, crashed=True)
    result = load_path(run, use_cache=False)
    records = result.ranks[0].records
    assert records is not None
    assert len(records.comms) == 1 and records.comms.loc[0, "bytes"] == 4096
    assert records.comms.loc[0, "rank"] == 0
    assert records.steps.loc[0, "rss_bytes"] == 123
    assert records.samples.empty and "t_ns" in records.samples.columns
    assert isinstance(records.manifest[0], schema.RunStart)
    assert problems_with(result, "rank 0", "sampler", "no NVML")
    assert problems_with(result, "rank 0", "no run_end")


def test_records_from_a_newer_schema_are_refused_but_the_trace_is_analysed(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    write_records(run, 0, schema_version=schema.SCHEMA_VERSION + 1)
    result = load_path(run, use_cache=False)
    trace = result.ranks[0]
    assert trace.records is None and len(trace.steps) == 3
    found = problems_with(result, str(run / "rank0.manifest.jsonl"), "rank 0",
                          f"schema version {schema.SCHEMA_VERSION + 1}")
    assert found and f"reads ({schema.SCHEMA_VERSION})" in found[0]


def test_bad_record_lines_in_the_middle_are_named(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    step = schema.ENCODER.encode(schema.StepRecord(step=1, start_ns=0, end_ns=5))
    (run / "rank0.steps.jsonl").write_bytes(step + b"\n{not json}\n" + step + b"\n")
    result = load_path(run, use_cache=False)
    assert len(result.ranks[0].records.steps) == 2
    assert problems_with(result, "rank0.steps.jsonl", "rank 0", "line 2")


def test_a_killed_rank_gets_its_records_recovered_and_is_reported_crashed(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    write_records(run, 0)
    write_killed_rank(run, 1, steps=5)
    result = load_path(run, use_cache=False)
    assert [t.rank for t in result.ranks] == [0, 1]
    ok, killed = result.ranks
    assert (ok.has_trace, ok.status) == (True, "ok")
    assert (killed.has_trace, killed.status) == (False, schema.STATUS_NO_END)
    assert killed.events.empty and killed.steps.empty and killed.world_size == 2
    assert killed.records.steps["step"].tolist() == [0, 1, 2, 3, 4]  # the cut last line dropped
    assert len(killed.records.comms) == 1
    assert problems_with(result, "rank 1", "no readable Kineto trace", "crashed",
                         "5 step records, 1 comm ops")
    assert problems_with(result, "rank1.manifest.jsonl.tmp", "rank 1", "no run_end")
    assert not problems_with(result, "no trace here")  # the killed rank is not missing


def test_read_only_trace_folder_gets_no_cache_even_for_root(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(world_size=1)])
    run.chmod(0o555)
    try:
        result = load_path(run)
        assert [t.rank for t in result.ranks] == [0] and result.problems == []
        assert not (run / CACHE_DIR).exists()
    finally:
        run.chmod(0o755)


# ---- communication kernels ----------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    "void deep_ep::internode::dispatch<true, 8>(int4*, float*)",
    "dpsk::ep::internode::combine", "dpsk::ep::internode::notify_dispatch",
    "void nvshmemi_transfer_rma_kernel<(nvshmemi_op_t)0>(void*)",
    "void vllm::cross_device_reduce_1stage<float, 8>(...)",
    "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float>(...)",
    "multimem_all_reduce_kernel", "two_shot_all_reduce_kernel",
])
def test_expert_parallel_one_sided_and_custom_all_reduce_kernels_are_communication(name, tmp_path):
    b = TraceBuilder(rank=0).step(1, 0, 100).compute(10, 20).kernel(name, 30, 50)
    events = load_path(write_run(tmp_path / "run", [b]), use_cache=False).ranks[0].events
    assert events.loc[events["name"] == name, "is_comm"].tolist() == [True]
    assert not events.loc[events["name"] == "volta_sgemm_128x64_nn", "is_comm"].any()


def test_comm_kernel_patterns_add_kernels_and_only_kernels(tmp_path):
    b = TraceBuilder(rank=0).step(1, 0, 100).kernel("my_ring_exchange", 30, 50)
    b.op("my_ring_exchange_host", 10, 20)
    run = write_run(tmp_path / "run", [b])
    assert not load_path(run, use_cache=False).ranks[0].events["is_comm"].any()
    events = load_path(run, comm_kernels=("ring_exch",)).ranks[0].events  # through the cache
    comm = events.loc[events["is_comm"], "name"].tolist()
    assert comm == ["my_ring_exchange"]


# ---- unfinished last steps ----------------------------------------------------------------------
def test_a_profiler_step_after_the_last_step_record_is_left_out(tmp_path):
    b = TraceBuilder(rank=0, world_size=1)
    for n in (7, 8, 9):
        b.step(n, n * 100, n * 100 + 100).compute(n * 100 + 10, n * 100 + 40)
    b.step(10, 1000, 1050)  # evaluation after training: the optimizer never stepped again
    run = write_run(tmp_path / "run", [b])
    records = b"".join(schema.ENCODER.encode(schema.StepRecord(step=n, start_ns=n, end_ns=n + 1))
                       + b"\n" for n in range(10))
    (run / schema.STEPS_FILE.format(rank=0)).write_bytes(records)
    result = load_path(run, use_cache=False)
    assert result.ranks[0].steps["step"].tolist() == [7, 8, 9]
    assert problems_with(result, "rank 0", "ProfilerStep 10 never reached its step end")
    # asked for by number, it is analysed
    assert load_path(run, "10", use_cache=False).ranks[0].steps["step"].tolist() == [10]


@pytest.mark.parametrize("last_us, kept", [(100, True), (140, True), (400, False), (30, False)])
def test_a_foreign_traces_last_step_is_left_out_when_abnormal(tmp_path, last_us, kept):
    b = TraceBuilder(rank=0, world_size=1)
    for n, dur in enumerate((100, 110, 95)):
        b.step(n, n * 200, n * 200 + dur)
    b.step(3, 600, 600 + last_us)
    result = load_path(write_run(tmp_path / "run", [b]), use_cache=False)
    assert result.ranks[0].steps["step"].tolist() == ([0, 1, 2, 3] if kept else [0, 1, 2])
    assert bool(problems_with(result, "rank 0", "ProfilerStep#3", "median of 0.10 ms")) is not kept
