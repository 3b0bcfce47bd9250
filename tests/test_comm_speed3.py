"""The paths that compute a rank's communication once (comm_events.KernelJoin shared by its ops
and the cross-rank events), the cross-rank ops built from arrays (frames.ops_from_events),
functions of column values taken once per distinct value (crossrank.distinct) and the issuers'
marker spans: against answers worked out by hand on small built frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from test_comm_fast_paths import four_ops, same
from test_communication import event, events_frame, make_trace

from analysis.crossrank import distinct
from analysis.crossrank.frames import OP_COLUMNS, ops_from_events
from analysis.rank import issuers
from analysis.rank import summary as rank_summary
from analysis.rank.comm import events as comm_events
from analysis.rank.comm import ops as communication
from analysis.rank.comm import sizes as comm_sizes
from analysis.rank.comm.kernel_names import named_kernels


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
    pd.testing.assert_frame_equal(tables["comm_ops"], shared, check_exact=True)
    pd.testing.assert_frame_equal(tables["comm_events"], rank_summary._comm_events(trace),
                                  check_exact=True)
    # K3 has no host op: it keeps its own collective, missing (the reader's NaN)
    assert same(tables["comm_events"]["collective"].tolist(),
                ["all_gather", "all_reduce", math.nan, "send"])


def test_rank_tables_without_events_columns_still_build_what_they_can():
    trace = make_trace(events_frame([event("aten::mm", "cpu_op", 0, 10)]).drop(columns="is_comm"))
    tables = rank_summary.rank_tables(trace)
    assert tables["event_count"] == 1
    assert tables["comm_ops"].empty and list(tables["comm_ops"].columns) == \
        communication.OPS_COLUMNS


# ---- ops_from_events -----------------------------------------------------------------------------
def comm_frame(rank_dtype="int64") -> pd.DataFrame:
    """Kernels of two ranks, out of order: rank 1's two all-reduces of 1024 floats over 2, rank
    0's all-gather of 10 halves over 4 (group size missing: the world's), and a kernel of no
    known op."""
    frame = pd.DataFrame({
        "rank": [1, 0, 1, 0], "name": ["k", "k", "k", "ncclDevKernel_Weird"],
        "ts_ns": [500, 300, 100, 50], "end_ns": [600, 400, 200, 60], "stream": [7, 8, 7, 8],
        "is_gpu": True, "collective": ["allreduce", "all_gather", "all_reduce", None],
        "in_nelems": [1024.0, 10.0, 1024.0, np.nan], "out_nelems": np.nan,
        "comm_dtype": ["Float", "Half", "Float", None], "group_size": [2.0, np.nan, 2.0, 2.0],
        "pg_name": ["0", None, "0", "0"], "input_dims": None, "input_type": None})
    return frame.astype({"rank": rank_dtype, "collective": object, "comm_dtype": object,
                         "pg_name": object, "input_dims": object, "input_type": object})


def steps_of() -> pd.DataFrame:
    return pd.DataFrame({"rank": [0, 1], "step": [3, 3], "start_ns": [0, 0],
                         "end_ns": [1000, 1000]})


def test_ops_from_events_are_sorted_typed_and_sized_as_worked_out_by_hand():
    ops = ops_from_events(comm_frame(), steps_of(), world_size=4)
    assert list(ops.columns) == OP_COLUMNS and isinstance(ops.index, pd.RangeIndex)
    assert ops["rank"].tolist() == [0, 1, 1] and ops["issue_ns"].tolist() == [300, 100, 500]
    assert ops["op"].tolist() == ["all_gather", "all_reduce", "all_reduce"]
    # all_gather: 10 x 2 B x 4 ranks; all_reduce: 1024 x 4 B
    assert ops["bytes"].tolist() == [80.0, 4096.0, 4096.0]
    assert ops["pg"].tolist() == ["unknown", "0", "0"] and ops["pg_size"].tolist() == [4, 2, 2]
    assert ops["queue"].tolist() == ["8", "7", "7"] and ops["step"].tolist() == [3, 3, 3]
    assert ops["dtype"].tolist() == ["float16", "float32", "float32"]
    assert {c: str(t) for c, t in ops.dtypes.items()} == {
        "rank": "int64", "pg": "object", "pg_size": "int64", "op": "object",
        "bytes": "float64", "dtype": "object", "step": "int64", "issue_ns": "int64",
        "end_ns": "int64", "peer": "float64", "queue": "object"}
    assert all(type(v) is str for c in ("pg", "op", "dtype", "queue") for v in ops[c])
    assert ops["peer"].isna().all()


def test_ops_from_events_of_ranks_not_as_integers_take_the_frame_path_to_the_same_ops():
    by_arrays = ops_from_events(comm_frame(), steps_of(), world_size=4)
    by_frame = ops_from_events(comm_frame("float64"), steps_of(), world_size=4)
    pd.testing.assert_frame_equal(by_arrays, by_frame, check_exact=True)


# ---- once per distinct value ---------------------------------------------------------------------
def test_by_value_calls_once_per_value_with_none_where_it_first_appears():
    seen = []

    def upper(value):
        seen.append(value)
        return None if value is None else value.upper()

    column = pd.Series([None, "a", None, "b", "a"], index=[9, 8, 7, 6, 5], dtype=object)
    result = distinct.by_value(column, upper)
    assert result.tolist() == [None, "A", None, "B", "A"] and result.dtype == object
    assert result.index.tolist() == [9, 8, 7, 6, 5]
    assert seen == [None, "a", "b"]
    # NaN and None both missing: each keyed by itself, as a dict keys them
    seen.clear()
    mixed = pd.Series(["a", None, np.nan, "a"], dtype=object)
    assert [type(v) for v in distinct.by_value(mixed, lambda v: v).tolist()] == [
        str, type(None), float, str]


def test_message_sizes_key_equal_numbers_alike_and_every_nan_alike():
    calls = []

    def counted(*row):
        calls.append(row)
        return len(calls)

    original = comm_sizes.message_bytes
    comm_sizes.message_bytes = counted
    try:
        sizes = comm_sizes.message_sizes(
            pd.Series(["all_reduce"] * 5, dtype=object),
            pd.Series([1.0, 1.0, np.nan, np.nan, 2.0]), np.array([np.nan] * 5),
            pd.Series(["Float", "Float", None, None, "Float"], dtype=object),
            np.array([2, 2, 2, 2, 2]))
    finally:
        comm_sizes.message_bytes = original
    assert sizes == [1, 1, 2, 2, 3]
    assert [type(v) for v in calls[0]] == [str, float, float, int, int]  # dtype_size(Float)



def test_message_sizes_of_unhashable_values_are_computed_row_by_row():
    # An "In msg nelems" that is a JSON list cannot be a key: each row is sized on its own.
    sizes = comm_sizes.message_sizes(["all_reduce", "all_reduce"], [[4], 8.0], [None, None],
                                     ["float32", "float32"], [2, 2])
    assert len(sizes) == 2 and math.isnan(sizes[0])  # a list is no count
    assert sizes[1] == 32.0  # 8 float32 elements

# ---- issuers' marker spans -----------------------------------------------------------------------
def test_marker_spans_are_found_among_host_names_only():
    rows = [event("FSDP::all_gather", "user_annotation", 0, 100),
            event("FSDP::all_gather", "gpu_user_annotation", 0, 100, is_gpu=True),
            event("DistributedDataParallel.forward", "user_annotation", 200, 100, tid="2"),
            event("aten::mm", "cpu_op", 10, 5)]
    for names in (object, "category"):
        events = events_frame(rows).astype({"name": names})
        spans = issuers._marker_spans(make_trace(events))
        assert [(issuer, starts.tolist(), ends.tolist(), threads)
                for issuer, starts, ends, threads in spans] == [
            ("fsdp2", [0.0], [100.0], [("100", "1")]),
            ("ddp", [200.0], [300.0], [("100", "2")])]


def test_issuers_of_ops_fall_back_once_per_op():
    events = events_frame([event("FullyShardedDataParallel.forward", "cpu_op", 0, 10)])
    op = np.array(["all_gather", None, "all_reduce", "send", "all_gather"], dtype=object)
    found = issuers.issuers_of_ops(make_trace(events), op, [50] * 5, ["100"] * 5, ["1"] * 5,
                                   np.array([True, True, False, True, False]))
    assert found.tolist() == ["fsdp1", "c10d", "unknown", "p2p", "fsdp1"]
