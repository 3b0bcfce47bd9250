"""Who issued each communication op and what DDP's forwards say about gradient accumulation
(analysis.rank.issuers), against answers worked out by hand on small built ranks."""

import numpy as np
import pandas as pd
import pytest

from analysis.rank import issuers
from helpers.comm_events import (
    MS,
    event,
    events_frame,
    host_event,
    kernel,
    make_trace,
    rank_of,
)


def ddp_rank(forwards_reduced: list[bool]) -> pd.DataFrame:
    """DDP forwards 10 ms apart, each followed by a gradient all-reduce (named by the call's
    collective, or by the op's own name) or not, and an unrelated kernel."""
    rows = []
    for i, reduced in enumerate(forwards_reduced):
        rows.append(host_event("DistributedDataParallel.forward", i * 10, 3))
        if reduced:
            rows.append(host_event("record_param_comms", i * 10 + 6, 0.1, collective="allreduce")
                        if i % 2 else host_event("nccl:all_reduce", i * 10 + 6, 0.1))
        rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", i * 10 + 7, 1))
    return events_frame(rows)


@pytest.mark.parametrize(("reduced", "steps", "verdict"), [
    ([True, True, True, True], 1, issuers.ACCUMULATING_WITHOUT_NO_SYNC),
    ([False, False, False, True], 1, issuers.NO_SYNC_USED),
    ([True, True, True, False], 1, issuers.ACCUMULATING_WITHOUT_NO_SYNC),  # last one cut off
    ([True, True], 2, issuers.NO_ACCUMULATION),
    ([False, False], 1, None),
])
def test_ddp_forwards_tell_gradient_accumulation(reduced, steps, verdict):
    events = ddp_rank(reduced)
    span = len(reduced) * 10 // steps
    step_spans = [(s, s * span * MS, (s + 1) * span * MS) for s in range(steps)]
    assert issuers.ddp_accumulation([rank_of(events, step_spans)]) == verdict


def test_issuers_of_ops_by_the_spans_around_them_and_the_frameworks_the_trace_shows():
    events = events_frame([
        host_event("FSDP::all_gather", 0, 10),
        host_event("DistributedDataParallel.forward", 20, 10),
        host_event("aten::mm", 40, 5),
        kernel("ncclKernel_AllGather_RING_LL_Sum_float", 5, 1),
        # A marker's name on the device is no marker, even on the host thread's ids.
        {**kernel("FullyShardedDataParallel._pre_forward", 60, 5), "pid": "1", "tid": "1"},
    ])
    op = np.array(["all_gather", "all_reduce", "all_reduce", "send", "broadcast", "broadcast",
                   "all_gather", "all_to_all"], dtype=object)
    host_ts = np.array([5, 25, 42, 50, 61, 62, 5, 2], dtype="float64") * MS
    host_tid = ["1", "1", "1", "1", "1", "1", "2", "1"]
    named = np.array([True, True, True, True, True, False, True, True])
    expected = ["fsdp2", "ddp", "ddp", "p2p", "c10d", "unknown", "fsdp2", "fsdp2"]
    found = issuers.issuers_of_ops(rank_of(events), op, host_ts, ["1"] * len(op), host_tid, named)
    assert found.tolist() == expected


def test_marker_spans_are_found_among_host_names_only():
    rows = [event("FSDP::all_gather", "user_annotation", 0, 100),
            event("FSDP::all_gather", "gpu_user_annotation", 0, 100, is_gpu=True),
            event("DistributedDataParallel.forward", "user_annotation", 200, 100, tid="2"),
            event("aten::mm", "cpu_op", 10, 5)]
    spans = issuers._marker_spans(make_trace(events_frame(rows)))
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


def test_step_spans_are_taken_by_start_with_unknown_starts_last():
    steps = pd.DataFrame({"step": [3, 1, 2, 0], "start_ns": [30, 10, 20, 5],
                          "end_ns": [35, 15, 25, 12]})
    starts, ends = issuers._spans_by_start(steps)
    assert starts.tolist() == [5.0, 10.0, 20.0, 30.0] and ends.tolist() == [12.0, 15.0, 25.0, 35.0]
    starts, ends = issuers._spans_by_start(steps.assign(start_ns=[30.0, np.nan, 20.0, 10.0]))
    assert starts.tolist()[:3] == [10.0, 20.0, 30.0] and np.isnan(starts[3])
    assert ends.tolist() == [12.0, 25.0, 35.0, 15.0]


def test_recorded_issuers_name_ops_and_agree_with_the_trace_of_the_same_ops():
    # A DDP rank: its forward, then in backward the reducer's bucket all-reduce, which the trace
    # gives to DDP (outside every marked span, with DDP's forward in the trace) and the tracer's
    # record names DDP's (CommRecord.issuer).
    trace = rank_of(events_frame([host_event("DistributedDataParallel.forward", 0, 10),
                                  host_event("gloo:all_reduce", 20, 1)]))
    from_trace = issuers.issuers_of_ops(trace, np.array(["all_reduce"], dtype=object),
                                        np.array([20.0]) * MS, ["1"], ["1"], np.array([True]))
    source = pd.Series(["native", "native", "c10d", "c10d", "ddp", "c10d", "native"])
    ops = pd.Series(["all_reduce", "all_reduce", "all_gather", "all_gather", "broadcast",
                     "reduce_scatter", "broadcast"])
    recorded = pd.Series(["ddp", None, "fsdp2", None, "ddp", "fsdp1", "mystery"])
    found = issuers.issuers_from_records(source, ops, trace, recorded)
    assert found.tolist() == ["ddp", "unknown", "fsdp2", "c10d", "ddp", "fsdp1", "unknown"]
    assert found[0] == from_trace[0] == "ddp"
    # Records written before the field: the source alone, as before
    assert issuers.issuers_from_records(source, ops, trace).tolist() == [
        "unknown", "unknown", "c10d", "c10d", "ddp", "c10d", "unknown"]
