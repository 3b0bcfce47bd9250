"""Communication kernels named by the host op that launched them (analysis.rank.comm.kernel_names)
and the rank's communication events table built from them (analysis.rank.reduction), against
answers worked out by hand on small built ranks."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.rank import reduction as rank_summary
from analysis.rank.comm.kernel_names import named_kernels
from helpers.comm_events import (
    events_frame,
    four_ops,
    host_event,
    kernel,
    rank_of,
)

# Labels 3, 23, ..., 93: the four kernels are 23, 53, 63 (no launch found) and 93. A text
# argument an event lacks is None, as the parser gives it.
NAMED = {
    "collective": [None, "all_gather", None, "all_reduce", None, "send", "send"],
    "in_nelems": [math.nan, math.nan, 1024.0, 256.0, math.nan, 100.0, 100.0],  # 53: its own
    "comm_dtype": [None, None, "Float", "Half", None, "Float", "Float"],
    "group_size": [math.nan, math.nan, 2.0, 2.0, math.nan, math.nan, 2.0],  # 93: its own
    "pg_name": [None, "7", "0", "0", None, "5", "9"],
    "input_dims": ["[[2, 3], [5]]", "[[2, 3], [5]]"] + [None] * 5,
}


def typed_values(column: pd.Series) -> list:
    return [(type(v), "nan" if isinstance(v, float) and math.isnan(v) else v) for v in column]


def test_kernels_take_their_host_op_s_name_and_the_arguments_they_lack():
    events = events_frame(four_ops())
    events.index = events.index * 10 + 3  # labels that are not positions
    named = named_kernels(events)
    assert named.index.tolist() == [3, 23, 33, 53, 63, 73, 93]
    for column, expected in NAMED.items():
        assert named[column].dtype == object, column
        # a float64 column's values as Python floats, as column.astype(object) holds them
        assert typed_values(named[column]) == typed_values(pd.Series(expected, dtype=object)), (
            column)
    assert list(named.columns) == list(events.columns)


def test_kernels_get_a_collective_column_where_the_trace_has_none():
    events = events_frame(four_ops()).drop(columns=["collective", "in_nelems"])
    named = named_kernels(events)
    assert list(named.columns) == list(events.columns) + ["collective"]
    assert "in_nelems" not in named.columns
    # 93: launched in a record_param_comms call that no longer names its op: not named
    assert typed_values(named["collective"]) == typed_values(pd.Series(
        [None, "all_gather", None, "all_reduce", None, None, None], dtype=object))


def comm_rank(with_kernels: bool) -> pd.DataFrame:
    rows = [host_event("record_param_comms", 0, 1, collective="allreduce"),
            host_event("aten::mm", 2, 1), host_event("nccl:all_reduce", 3, 1)]
    if with_kernels:
        rows += [kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1, 2), kernel("gemm", 4, 1),
                 kernel("ncclKernel_Broadcast_RING_LL_Sum_float", 5, 1)]
    for i, row in enumerate(rows):
        row.update(stream=7 if row["is_gpu"] else -1, in_nelems=float(i) if i % 2 else np.nan,
                   pg_name="0")
    return events_frame(rows)


@pytest.mark.parametrize("with_kernels", [True, False])
def test_the_comm_events_table_is_the_kernels_or_else_the_host_ops(with_kernels):
    events = comm_rank(with_kernels)
    found = rank_summary._comm_events(rank_of(events))
    assert list(found.columns) == [c for c in rank_summary.OP_EVENT_COLUMNS
                                   if c in events.columns]
    assert found["name"].dtype == object
    assert found["name"].tolist() == (
        ["ncclKernel_AllReduce_RING_LL_Sum_float", "ncclKernel_Broadcast_RING_LL_Sum_float"]
        if with_kernels else ["record_param_comms", "nccl:all_reduce"])
    assert found["ts_ns"].tolist() == ([1_000_000, 5_000_000] if with_kernels
                                       else [0, 3_000_000])
    nelems = found["in_nelems"].tolist()
    assert nelems == [3.0, 5.0] if with_kernels else all(math.isnan(n) for n in nelems)
