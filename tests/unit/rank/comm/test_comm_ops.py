"""A rank's communication ops from its trace's events (analysis.rank.comm.event_ops and ops) against
answers worked out by hand on small built ranks: each kernel sized its own way, the ops' order
and steps, their bandwidths, the DDP buckets that records without the comm hook take from the
trace, and the rank's tables built from one join."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.rank import reduction as rank_summary
from analysis.rank.comm import comm_ops as communication
from analysis.rank.comm import enclosing
from analysis.rank.comm import event_ops as comm_events
from analysis.rank.comm.kernel_names import named_kernels
from helpers.comm_events import (
    MS,
    comm_records,
    event,
    events_frame,
    four_ops,
    host_event,
    kernel,
    make_trace,
    rank_of,
    records_with,
    same,
    steps_frame,
)
from tracer import schema

EXPECTED = {
    "op": ["all_gather", "all_reduce", "other", "send"],
    "source": [None, None, None, "p2p"],
    "pg": ["7", None, None, "9"],
    "pg_desc": [None, None, None, "kernel_pg"],
    "pg_size": [4, None, None, 2.0],
    "dtype": ["bfloat16", "float16", None, "float32"],
    "bytes": [48.0, 512.0, math.nan, 400.0],
    "duration_us": [1.0, 2.0, 0.5, 1.0],
    # A launch's time as the launches' float array holds it; a kernel's or a call's as integers.
    "host_ts": [np.float64(1_100), np.float64(2_100), 9_000, 3_000],
    "host_pid": ["100", "100", "0", "100"],
    "host_tid": ["1", "1", "7", "1"],
    "named": [True, True, False, True],
}


# ---- each kernel's op ----------------------------------------------------------------------------
def test_each_kernel_is_sized_its_own_way_as_worked_out_by_hand():
    events = events_frame(four_ops())
    columns = comm_events.op_columns(events, None, None, world_size=4)
    for name, expected in EXPECTED.items():
        assert same(columns[name], expected), name
    assert columns["step"] == -1  # no ProfilerStep: one window
    ops = communication.comm_ops(make_trace(events, world_size=4))
    assert ops["bytes"].tolist()[:2] == [48.0, 512.0] and ops["pg_size"].tolist()[0] == 4


def test_the_ops_frame_holds_the_ops_values_with_rank_and_origin():
    frame = comm_events.ops_from_events(events_frame(four_ops()), None, None, 3, 4)
    assert isinstance(frame.index, pd.RangeIndex)
    for name, expected in EXPECTED.items():
        values = [None if not isinstance(v, str) and pd.isna(v) else v for v in frame[name]]
        assert values == [None if not isinstance(v, str) and pd.isna(v) else v
                          for v in expected], name
    assert frame["rank"].tolist() == [3] * 4 and frame["origin"].tolist() == ["trace"] * 4
    assert frame["step"].tolist() == [-1] * 4


def test_kernels_without_the_argument_columns_are_named_by_their_kernel():
    events = events_frame(four_ops()).drop(columns=[
        "correlation", "collective", "in_nelems", "out_nelems", "comm_dtype", "group_size",
        "pg_name", "pg_desc", "input_dims", "input_type"])
    columns = comm_events.op_columns(events, None, None, world_size=4)
    # No launch can be found and no call names an op: each kernel is its own, unsized op.
    assert columns["op"] == ["all_gather", "all_reduce", "other", "other"]
    assert columns["host_ts"] == [5_000, 7_000, 9_000, 11_000]
    assert columns["named"] == [False] * 4
    assert columns["pg_size"] == [None] * 4 and all(math.isnan(b) for b in columns["bytes"])


def test_a_trace_without_communication_has_no_ops():
    events = events_frame([event("aten::mm", "cpu_op", 0, 10)])
    assert comm_events.op_columns(events, None, None, 2) is None
    assert comm_events.ops_from_events(events, None, None, 0, 2).empty
    assert list(communication.comm_ops(make_trace(events)).columns) == communication.OPS_COLUMNS
    hosts = comm_events.kernel_host_ops(events)
    assert hosts.empty and list(hosts.columns) == ["host", "op"]


def test_kernel_host_ops_give_the_label_of_the_op_around_each_launch():
    events = events_frame(four_ops())
    events.index = events.index * 10 + 3  # labels that are not positions
    hosts = comm_events.kernel_host_ops(events)
    assert hosts.index.tolist() == [23, 53, 63, 93]
    assert hosts["host"].tolist() == [3, 33, -1, 73]
    assert same(hosts["op"].tolist(), ["all_gather", "all_reduce", math.nan, "send"])


def launched(events: list[dict], correlation: int, launch_ms: float) -> list[dict]:
    """The events with a runtime launch (at `launch_ms` on the host thread) of the kernel with
    that correlation id."""
    launch = {**host_event("cudaLaunchKernel", launch_ms, 0.01), "cat": "cuda_runtime",
              "correlation": correlation}
    return [*events, launch]


def test_comm_ops_of_a_call_and_a_lone_kernel_as_worked_out_by_hand():
    call = {**host_event("record_param_comms", 1, 2, collective="allreduce"),
            "in_nelems": 1024.0, "out_nelems": 1024.0, "comm_dtype": "Float", "group_size": 2.0,
            "pg_name": "0", "pg_desc": "default_pg"}
    rows = [call, {**kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 0.5),
                   "correlation": 11},
            # A kernel whose launch is under no call: sized by nothing, named by its own name.
            {**kernel("ncclDevKernel_Broadcast_RING_LL", 9, 0.25), "correlation": 12},
            host_event("aten::mm", 7, 1)]
    rows = launched(launched(rows, 11, 1.5), 12, 7.5)
    events = events_frame([{"correlation": -1, "stream": 7 if row["is_gpu"] else -1, **row}
                           for row in rows])
    ops = communication.comm_ops(rank_of(events))
    assert ops["op"].tolist() == ["all_reduce", "broadcast"]
    assert ops["bytes"].tolist()[0] == 4096.0 and np.isnan(ops["bytes"].tolist()[1])
    assert ops["duration_us"].tolist() == [500.0, 250.0]
    assert ops["pg_desc"].tolist() == ["default_pg", None]
    assert ops["issuer"].tolist() == ["c10d", "unknown"]
    assert ops["pg_size"].tolist()[0] == 2 and ops["step"].tolist() == [-1, -1]


# ---- order and steps -----------------------------------------------------------------------------
@pytest.mark.parametrize("kept", [None, [True, True, False, True, True, False, True, True]])
def test_ops_are_in_the_order_they_ran_ties_in_row_order_and_unknown_times_last(kept):
    sort_ts = pd.Series([5.0, np.nan, 1.0, 5.0, -0.0, 0.0, np.nan, 1.0])
    order = [4, 5, 2, 7, 0, 3, 1, 6]  # -0.0 and 0.0 tie, as do the two 1.0 and the two 5.0
    if kept is not None:
        order = [i for i in order if kept[i]]
        kept = np.array(kept)
    assert enclosing.sorted_positions(sort_ts, kept).tolist() == order
    assert enclosing.sorted_positions(pd.Series([3, 1, 2]), None).tolist() == [1, 2, 0]


def test_ops_outside_the_selected_steps_go():
    spans = pd.DataFrame({"step": [1, 2, 3], "start_ns": [0, 10, 20], "end_ns": [10, 20, 30]})
    host_ts = pd.Series([5, 15, 25, 35, np.nan, -1])
    step, kept = enclosing.steps_kept(host_ts, spans[spans["step"] != 2], spans)
    assert step.tolist() == [1, 2, 3, pd.NA, pd.NA, pd.NA]
    assert kept.tolist() == [True, False, True, True, True, True]
    step, kept = enclosing.steps_kept(host_ts, spans, None)
    assert step.tolist() == [1, 2, 3, pd.NA, pd.NA, pd.NA] and kept is None
    assert enclosing.steps_kept(host_ts, None, None) == (-1, None)


# ---- bandwidths and the ops table's columns ------------------------------------------------------
def test_bandwidths_of_each_op_as_worked_out_by_hand():
    columns = {
        "op": np.array(["all_reduce", "barrier", "all_gather", "broadcast", "all_reduce", "send",
                        "all_reduce"], dtype=object),
        "bytes": np.array([8000.0, 0.0, np.nan, 1000.5, 100.0, 100.0, 2.5]),
        "pg_size": pd.array([2, 4, 2, None, 0, 2, 4], dtype="Int64"),
        "duration_us": np.array([2.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]),
    }
    found = communication._with_bandwidths(columns)
    # 8000 B in 2 us: 4 GB/s, x 2(n-1)/n = 1 on two ranks; a barrier moves nothing; 1000.5 B
    # round to 1000 (half to even), 2.5 B to 2; no time or no size: no bandwidth of that kind.
    assert same(found["algbw_gbps"].tolist(), [4.0, 0.0, math.nan, 1.0, 0.1, 0.0, 0.002])
    assert same(found["busbw_gbps"].tolist(),
                [4.0, 0.0, math.nan, math.nan, math.nan, 0.0, 0.002 * 1.5])


@pytest.mark.parametrize(("values", "expected"), [
    (pd.Series([3, -1, 7], dtype="int64"), [3, -1, 7]),
    (pd.Series([3, None, 7], dtype="Int64"), [3, None, 7]),
    (pd.Series([2.5, np.nan, 7.4]), [2, None, 7]),  # to the even integer, as round() does
    (pd.Series(["3", None, 7], dtype=object), [3, None, 7]),
])
def test_count_columns_are_the_rounded_integers(values, expected):
    found = communication.int64(values)
    assert found.dtype == "Int64"
    assert [None if v is pd.NA else v for v in found.tolist()] == expected
    assert found is not values.array  # a copy: the ops table owns its columns


# ---- DDP buckets the records lack ----------------------------------------------------------------
def run_start(ddp_buckets) -> schema.RunStart:
    return schema.RunStart(schema_version=1, run_name="run", rank=0, local_rank=0, world_size=2,
                           host="h", pid=1, start_ns=0, argv=[], script="train.py",
                           script_args=[], torch_version="2", config={},
                           ddp_buckets=ddp_buckets)


def test_records_without_the_ddp_hook_take_the_bucket_all_reduces_from_the_trace():
    rows = [
        event("DistributedDataParallel.forward", "user_annotation", 0, 3 * MS),
        # backward: DDP's bucket all-reduce, then a broadcast of the script's own
        event("record_param_comms", "cpu_op", 6 * MS, MS, is_comm=True, collective="allreduce",
              in_nelems=1024, comm_dtype="Float", group_size=2, pg_name="0"),
        event("cudaLaunchKernel", "cuda_runtime", 6 * MS + 500, 10, correlation=1),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 8 * MS, 500_000,
              correlation=1, is_gpu=True, is_comm=True),
        event("record_param_comms", "cpu_op", 10 * MS, MS, is_comm=True, collective="broadcast",
              in_nelems=10, comm_dtype="Float", group_size=2, pg_name="0"),
        event("cudaLaunchKernel", "cuda_runtime", 10 * MS + 500, 10, correlation=2),
        event("ncclDevKernel_Broadcast_RING_LL", "kernel", 12 * MS, 100_000, correlation=2,
              is_gpu=True, is_comm=True),
    ]
    comms = comm_records([{"step": 1, "op": "all_gather", "pg_size": 2, "bytes": 800.0,
                           "duration_us": 10.0, "source": "c10d", "rank": 0}])
    for ddp_buckets, expected in ((schema.DDP_BUCKETS_FROM_PROFILER, 2), ("comm hook", 1)):
        trace = make_trace(events_frame(rows), records=records_with(comms, [run_start(
            ddp_buckets)]))
        ops = communication.comm_ops(trace)
        assert list(ops.columns) == communication.OPS_COLUMNS and len(ops) == expected
    assert ops.iloc[0][["op", "origin", "issuer"]].tolist() == ["all_gather", "records", "c10d"]
    trace = make_trace(events_frame(rows), records=records_with(comms, [run_start(
        schema.DDP_BUCKETS_FROM_PROFILER)]))
    bucket = communication.comm_ops(trace).iloc[1]
    assert (bucket["op"], bucket["origin"], bucket["issuer"], bucket["rank"]) == (
        "all_reduce", "trace", "ddp", 0)
    assert (bucket["bytes"], bucket["duration_us"], bucket["pg"], bucket["pg_size"],
            bucket["dtype"], bucket["step"]) == (4096.0, 500.0, "0", 2, "float32", -1)


def test_native_records_hold_the_buckets_so_the_trace_adds_none():
    # The Flight Recorder's records hold every collective, DDP's buckets included: the windows'
    # bucket all-reduces would be counted twice, whatever the run's start says.
    rows = [
        event("DistributedDataParallel.forward", "user_annotation", 0, 3 * MS),
        event("record_param_comms", "cpu_op", 6 * MS, MS, is_comm=True, collective="allreduce",
              in_nelems=1024, comm_dtype="Float", group_size=2, pg_name="0"),
        event("cudaLaunchKernel", "cuda_runtime", 6 * MS + 500, 10, correlation=1),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 8 * MS, 500_000,
              correlation=1, is_gpu=True, is_comm=True),
    ]
    comms = comm_records([{"step": 1, "op": "all_reduce", "pg_size": 2, "bytes": 4096.0,
                           "duration_us": 0.0, "source": "native", "timing": "issue",
                           "rank": 0}])
    trace = make_trace(events_frame(rows), records=records_with(comms, [run_start(
        schema.DDP_BUCKETS_FROM_PROFILER)]))
    ops = communication.comm_ops(trace)
    assert ops[["op", "origin", "source"]].values.tolist() == [["all_reduce", "records",
                                                                "native"]]
    # Timed at issue only: its time and bandwidths are unknown, never 0 GB/s.
    assert ops[["duration_us", "algbw_gbps", "busbw_gbps"]].isna().all(axis=None)


# ---- one join per rank ---------------------------------------------------------------------------
def test_a_shared_join_gives_what_each_caller_finds_alone():
    events = events_frame(four_ops())
    trace = make_trace(events, world_size=4)
    join = comm_events.KernelJoin(events)
    hosts = comm_events.kernel_host_ops(events, join)
    assert hosts["host"].tolist() == [0, 3, -1, 7]
    assert same(hosts["op"].tolist(), ["all_gather", "all_reduce", math.nan, "send"])
    shared = communication.comm_ops(trace, join)
    pd.testing.assert_frame_equal(shared, communication.comm_ops(trace), check_exact=True)
    assert shared["bytes"].tolist()[:2] == [48.0, 512.0]
    pd.testing.assert_frame_equal(named_kernels(events, hosts), named_kernels(events),
                                  check_exact=True)
    # The rank's tables, built with one join, are the ones each builder gives alone.
    tables = rank_summary.rank_tables(trace)
    pd.testing.assert_frame_equal(tables.comm_ops, shared, check_exact=True)
    pd.testing.assert_frame_equal(tables.comm_events, rank_summary._comm_events(trace),
                                  check_exact=True)
    # K3 has no host op: it keeps its own collective, missing (None, as the parser gives it)
    assert same(tables.comm_events["collective"].tolist(),
                ["all_gather", "all_reduce", None, "send"])


def test_rank_tables_without_events_columns_still_build_what_they_can():
    trace = make_trace(events_frame([event("aten::mm", "cpu_op", 0, 10)]).drop(columns="is_comm"))
    tables = rank_summary.rank_tables(trace)
    assert tables.event_count == 1
    assert tables.comm_ops.empty and list(tables.comm_ops.columns) == \
        communication.OPS_COLUMNS


def test_ops_follow_the_steps_of_the_trace():
    rows = [event("record_param_comms", "cpu_op", 1_000, 500, is_comm=True,
                  collective="allreduce", in_nelems=4, comm_dtype="Float", group_size=2),
            event("record_param_comms", "cpu_op", 60_000, 500, is_comm=True,
                  collective="allreduce", in_nelems=4, comm_dtype="Float", group_size=2)]
    trace = make_trace(events_frame(rows), steps_frame([(4, 0, 50_000), (5, 50_000, 100_000)]))
    assert communication.comm_ops(trace)["step"].tolist() == [4, 5]
