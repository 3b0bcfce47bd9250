"""The communication ops' column-at-once paths (comm_events._kernel_ops, frame_columns'
values_or_none, each_distinct and texts, enclosing's thread_ids and launches) against answers
worked out by hand on small built ranks, with every column kind the trace reader or a caller may
give: text as pandas' strings, as objects and as categoricals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_communication import event, events_frame, make_trace

from analysis.core import frame_columns
from analysis.rank.comm import enclosing
from analysis.rank.comm import events as comm_events
from analysis.rank.comm import ops as communication

HOST = {"pid": "100", "tid": "1"}


def four_ops() -> list[dict]:
    """Four kernels, each sized another way (the expected values below say how)."""
    return [
        # K1: its hint has no counts: "Input Dims" [2, 3] of BFloat16 (2 bytes), all_gather over
        # the world size (4): 6 x 4 x 2 = 48 bytes; the group's name from the kernel.
        event("nccl:all_gather", "user_annotation", 1_000, 500, is_comm=True,
              input_dims="[[2, 3], [5]]", input_type='["c10::BFloat16", "float"]'),
        event("cudaLaunchKernel", "cuda_runtime", 1_100, 10, correlation=1),
        event("ncclDevKernel_AllGather_RING_LL", "kernel", 5_000, 1_000, correlation=1,
              is_gpu=True, is_comm=True, pg_name="7"),
        # K2: has counts of its own (256 Half), so the hint only names it; no group size.
        event("c10d::allreduce_", "cpu_op", 2_000, 500, is_comm=True, in_nelems=1024,
              comm_dtype="Float", group_size=2, pg_name="0"),
        event("cudaLaunchKernel", "cuda_runtime", 2_100, 10, correlation=2),
        event("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", 7_000, 2_000, correlation=2,
              is_gpu=True, is_comm=True, in_nelems=256, comm_dtype="Half"),
        # K3: no launch in the trace, no name that gives its op: issued at its own start.
        event("ncclDevKernel_SendRecv", "kernel", 9_000, 500, correlation=99, tid="7",
              is_gpu=True, is_comm=True),
        # K4: launched inside a send call without a group size: the kernel's group.
        event("record_param_comms", "cpu_op", 3_000, 800, is_comm=True, collective="send",
              in_nelems=100, comm_dtype="Float", pg_name="5"),
        event("cudaLaunchKernel", "cuda_runtime", 3_100, 10, correlation=4),
        event("ncclDevKernel_SendRecv", "kernel", 11_000, 1_000, correlation=4, is_gpu=True,
              is_comm=True, group_size=2, pg_name="9", pg_desc="kernel_pg"),
    ]


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


def text_kinds(frame: pd.DataFrame) -> list[pd.DataFrame]:
    """The frame with its text columns as pandas' strings, objects, and categoricals."""
    text = ["name", "cat", "pid", "tid", "collective", "comm_dtype", "pg_name", "pg_desc",
            "input_dims", "input_type"]
    as_objects = frame.astype({c: object for c in text})
    as_categories = frame.astype({c: pd.CategoricalDtype(pd.Index(
        frame[c].dropna().unique(), dtype=object)) for c in ("name", "cat", "pid", "tid")})
    return [frame, as_objects, as_categories]


def same(found: list, expected: list) -> bool:
    """Equal values of equal types, NaN equal to NaN."""
    def key(v):
        return (type(v), "nan" if isinstance(v, float) and math.isnan(v) else v)
    return [key(v) for v in found] == [key(v) for v in expected]


@pytest.mark.parametrize("kind", range(3))
def test_each_kernel_is_sized_its_own_way_as_worked_out_by_hand(kind):
    events = text_kinds(events_frame(four_ops()))[kind]
    columns = comm_events.op_columns(events, None, None, world_size=4)
    for name, expected in EXPECTED.items():
        assert same(columns[name], expected), name
    assert columns["step"] == -1  # no ProfilerStep: one window
    ops = communication.comm_ops(make_trace(events, world_size=4))
    assert ops["bytes"].tolist()[:2] == [48.0, 512.0] and ops["pg_size"].tolist()[0] == 4


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


# ---- frame_columns -------------------------------------------------------------------------------
@pytest.mark.parametrize("column, expected", [
    (pd.Series([1.5, np.nan, 2.0]), [1.5, None, 2.0]),
    (pd.Series([3, 4, 5]), [3, 4, 5]),
    (pd.Series(["a", None, "b"], dtype=object), ["a", None, "b"]),
    (pd.Series(["a", np.nan, pd.NA], dtype=object), ["a", None, None]),
    (pd.Series(["a", None, "a"], dtype="category"), ["a", None, "a"]),
    (pd.Series(["a", None, "b"], dtype="str"), ["a", None, "b"]),
    (pd.Series([1, None, 3], dtype="Int64"), [1, None, 3]),
    # pd.isna of a one-value list-like is that value's: [nan] is missing, [1, 2] is not.
    (pd.Series([[np.nan], [1, 2], None], dtype=object), [None, [1, 2], None]),
])
def test_values_or_none_leaves_none_for_each_missing_value(column, expected):
    found = frame_columns.values_or_none(column, np.array([0, 1, 2]))
    assert found.dtype == object and same(found.tolist(), expected)


def test_each_distinct_keeps_values_that_compare_equal_but_print_apart():
    values = frame_columns.object_array([0.0, -0.0, 1, True, 1.0, None, "x", "x"])
    assert frame_columns.each_distinct(values, str).tolist() == [
        "0.0", "-0.0", "1", "True", "1.0", "None", "x", "x"]
    texts = frame_columns.object_array(["b", None, "a", "b", np.nan])
    assert frame_columns.each_distinct(texts, repr).tolist() == [
        "'b'", "None", "'a'", "'b'", "nan"]


def test_texts_of_a_categorical_print_a_missing_value_as_nan():
    column = pd.Series(["x", None, 7], dtype=pd.CategoricalDtype(pd.Index(["x", 7],
                                                                          dtype=object)))
    assert frame_columns.texts(column, np.array([2, 1, 0])).tolist() == ["7", "nan", "x"]


# ---- enclosing -----------------------------------------------------------------------------------
def test_thread_ids_are_equal_where_pid_and_tid_print_alike():
    threads, queries = enclosing.thread_ids([1, "1", "2"], ["5", 5, "5"],
                                            ["1", "2", None, "1"], [5, "5", None, "6"])
    assert threads[0] == threads[1] != threads[2]
    assert queries[0] == threads[0] and queries[1] == threads[2]
    assert queries[2] not in threads and queries[3] not in threads


def test_launches_are_the_first_runtime_or_driver_event_of_each_id():
    rows = [
        event("cudaLaunchKernel", "cuda_runtime", 100, 5, correlation=1, tid="3"),
        event("cudaLaunchKernel", "cuda_runtime", 200, 5, correlation=1, tid="4"),
        event("cuLaunchKernel", "cuda_driver", 300, 5, correlation=2, tid="5"),
        event("aten::mm", "cpu_op", 400, 5, correlation=3),  # not a launch
        event("other_kernel", "kernel", 450, 5, correlation=4, is_gpu=True),
        event("ncclKernel", "kernel", 500, 5, correlation=1, is_gpu=True, is_comm=True),
    ]
    events = events_frame(rows)
    is_gpu = events["is_gpu"].to_numpy()
    ts, pid, tid = enclosing.launches(events, is_gpu, np.array([2.0, 1.0, 3.0, 4.0, np.nan]))
    assert same(ts.tolist(), [300.0, 100.0, math.nan, math.nan, math.nan])
    assert pid.tolist() == ["100", "100", None, None, None]
    assert tid.tolist() == ["5", "3", None, None, None]


# ---- communication -------------------------------------------------------------------------------
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
