"""Bottleneck advice that fits the code that issued the top collective (analysis.findings.advice,
docs/report.md)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.core.model import RankTrace
from analysis.findings.bottlenecks import find_bottlenecks
from helpers.comm_events import events_frame, steps_frame
from helpers.findings_inputs import (
    MIB,
    balanced,
    collective,
    collectives,
    finding,
    gaps,
    late_rank_1,
    memory_rank,
    per_step,
    reduced,
    run,
    step_row,
    trace,
)


# ---- advice that fits what issued the op -----------------------------------------------------
def host_event(name, ts_us, dur_us, *, tid="1", collective=None) -> dict:
    return {"name": name, "cat": "cpu_op", "ts_ns": int(ts_us * 1000), "dur_ns": int(dur_us * 1000),
            "pid": "1", "tid": tid, "is_gpu": False,
            "is_comm": name == "record_param_comms" or name.startswith("gloo:"),
            "collective": collective}


def traced(rank, rows, steps=None) -> RankTrace:
    base = trace(rank, "gloo")
    base.events = events_frame(rows)
    if steps is not None:
        base.all_steps = base.steps = steps_frame(steps)
    return reduced(base)


def exposed_advice(issuer, op="all_reduce", traces=None) -> pd.Series:
    colls = collectives([collective(op, "0", 2, 16 * MIB, 60_000, 20.0, issuer=issuer)])
    return finding(run(balanced(exposed=20), colls=colls, traces=traces), "exposed communication")


FSDP1_WORDS = ("forward_prefetch=", "backward_prefetch=", "BACKWARD_PRE", "MixedPrecision(")
DDP_WORDS = ("bucket_cap_mb", "no_sync", "static_graph", "gradient_as_bucket_view")


def test_fsdp2_gets_fully_shard_advice_not_fsdp1_options():
    for op in ("all_gather", "reduce_scatter"):
        suggestion = exposed_advice("fsdp2", op)["suggestion"]
        assert not any(word in suggestion for word in FSDP1_WORDS), suggestion
        assert "FSDP2" in suggestion
    assert "set_modules_to_forward_prefetch" in exposed_advice("fsdp2", "all_gather")["suggestion"]
    assert "reshard_after_forward" in exposed_advice("fsdp2", "all_gather")["suggestion"]
    assert "set_requires_gradient_sync" in exposed_advice("fsdp2", "reduce_scatter")["suggestion"]
    assert "forward_prefetch=True" in exposed_advice("fsdp1", "all_gather")["suggestion"]


def test_functional_and_hand_written_all_reduces_get_no_ddp_advice():
    for issuer in ("functional", "c10d", "unknown"):
        row = exposed_advice(issuer)
        assert not any(word in row["suggestion"] for word in DDP_WORDS), (issuer, row["suggestion"])
    assert "SequenceParallel" in exposed_advice("functional")["suggestion"]
    assert "async_op=True" in exposed_advice("c10d")["suggestion"]
    assert "torch.distributed all_reduce pg 0" in exposed_advice("c10d")["evidence"]


def ddp_trace(forwards_reduced: list[bool]) -> RankTrace:
    """One step of DDP forwards (10 ms apart), each followed by a gradient all-reduce or not."""
    rows = []
    for i, synced in enumerate(forwards_reduced):
        rows.append(host_event("DistributedDataParallel.forward", i * 10_000, 3_000))
        if synced:
            rows.append(host_event("record_param_comms", i * 10_000 + 6_000, 100,
                                   collective="allreduce"))
    return traced(0, rows, steps=[(0, 0, len(forwards_reduced) * 10_000_000)])


def test_no_sync_is_suggested_only_to_runs_accumulating_without_it():
    without = exposed_advice("ddp", traces=[ddp_trace([True, True, True, True])])["suggestion"]
    assert "no_sync" in without and "bucket_cap_mb" in without
    already = exposed_advice("ddp", traces=[ddp_trace([False, False, False, True])])["suggestion"]
    assert "no_sync" not in already and "bucket_cap_mb" in already
    single = exposed_advice("ddp", traces=[ddp_trace([True])])["suggestion"]
    assert "no_sync" not in single
    assert "no_sync" not in exposed_advice("ddp")["suggestion"]  # records alone cannot tell


def test_findings_name_groups_by_their_names():
    colls = collectives([collective("all_reduce", "mesh_dp (1)", 2, 16 * MIB, 60_000, 20.0,
                                    issuer="ddp", pg_id="1")])
    row = finding(run(balanced(exposed=20), colls=colls), "exposed communication")
    assert "DDP all_reduce on mesh_dp (pg 1) 16-32 MiB x10" in row["evidence"]


# ---- pipeline schedule -----------------------------------------------------------------------
def interleaved_trace(rank, stages, microbatches=4, ranks=2) -> RankTrace:
    """ScheduleInterleaved1F1B's PP: action spans: forwards switch stage every `ranks`
    microbatches, then full backwards, with the p2p sends between them."""
    order = []
    for start in range(0, microbatches, ranks):
        for stage in stages:
            order += [f"PP:{stage}F{mb}" for mb in range(start, start + ranks)]
    for start in range(0, microbatches, ranks):
        for stage in reversed(stages):
            order += [f"PP:{stage}B{mb}" for mb in range(start, start + ranks)]
            order.append(f"PP:{stage}SEND_B{start}")
    rows = [host_event(name, 100 * i, 50) for i, name in enumerate(order)]
    return traced(rank, rows)


def pipeline_steps():
    return per_step([step_row(r, s, compute=20, comm=5, overlap=0, exposed=0)
                     for r in (0, 1) for s in range(2)])


def test_interleaved_pipeline_counts_every_stage_and_is_not_told_to_interleave():
    traces = [interleaved_trace(0, [0, 2]), interleaved_trace(1, [1, 3])]
    p2p = collectives([collective("send", "0", 2, 256, 10, 0.1, issuer="p2p")])
    row = finding(run(pipeline_steps(), colls=p2p, traces=traces), "pipeline bubble")
    assert row["evidence"].startswith("4 pipeline stages on 2 ranks (2 per rank, interleaved "
                                      "schedule), 4 microbatches")
    assert "Interleaved1F1B" not in row["suggestion"]
    # p=2 ranks, v=2 stages each, m=4: (p-1)/(v*m+p-1) = 1/9; m=16: 1/33.
    assert "v=2 stages per rank (m=4: 11%, m=16: 3%)" in row["suggestion"]
    assert "ZeroBubble" in row["suggestion"]


def test_single_stage_pipeline_is_offered_interleaving():
    traces = [interleaved_trace(0, [0]), interleaved_trace(1, [1])]
    p2p = collectives([collective("send", "0", 2, 256, 10, 0.1, issuer="p2p")])
    row = finding(run(pipeline_steps(), colls=p2p, traces=traces), "pipeline bubble")
    assert row["evidence"].startswith("2 pipeline stages, 4 microbatches")
    assert "ScheduleInterleaved1F1B" in row["suggestion"]


def test_no_findings_without_analysed_steps():
    # Memory near capacity would fire on this per-rank table; a run without steps gets nothing.
    per_rank = pd.DataFrame([memory_rank(0, 38, 30)])
    assert run(per_step([]), per_rank=per_rank).empty


# ---- with the cross-rank pass --------------------------------------------------------------------
def test_ranks_wait_for_the_late_rank_and_waiting_is_not_exposed_transfer():
    table, colls, result = late_rank_1()
    before = run(table, colls=colls)
    assert "exposed communication" in before["finding"].tolist()  # 34 of 200 ms, mostly waiting
    assert "straggler: rank 1" in before["finding"].tolist()
    after = find_bottlenecks(table, pd.DataFrame(), colls, gaps([]), [trace(0), trace(1)],
                             cross_rank=result)
    names = after["finding"].tolist()
    row = finding(after, "ranks wait for rank 1")
    assert row["share_pct"] == pytest.approx(15.0)  # 12 x 30 ms of 2 ranks x 12 x 100 ms
    assert "wait 30.00 ms per step for rank 1" in row["evidence"]
    assert "all_reduce on pg 0" in row["evidence"]
    assert row["ranks"] == "0"
    # Left after the waits: 2 ms of exposed transfer per rank and step, 2% of step time.
    assert not {"exposed communication", "exposed transfer", "straggler: rank 1"} & set(names)
    assert not after["suggestion"].str.contains("bucket_cap_mb").any()
