"""Advice only where the evidence supports it (analysis.findings.advice, docs/report.md): bucket
advice by DDP's buckets per step, length bucketing by traced input shapes, device words on GPU
traces only."""

from __future__ import annotations

from analysis.findings.inputs import ddp_buckets, input_shapes_vary
from helpers.comm_events import event, events_frame, steps_frame
from helpers.findings_inputs import (
    MIB,
    MS,
    balanced,
    collective,
    collectives,
    finding,
    gaps,
    per_step,
    reduced,
    run,
    step_row,
    trace,
)


def ddp_group(count, rank_steps, bucket=256, total_bytes=None):
    row = collective("all_reduce", "0", 2, bucket, 60_000, 0.1, count=count,
                     rank_steps=rank_steps, issuer="ddp")
    if total_bytes is not None:
        row["total_bytes"] = float(total_bytes)
    return row


def ddp_advice(group) -> str:
    return finding(run(balanced(exposed=20), colls=collectives([group])),
                   "exposed communication")["suggestion"]


def test_one_small_ddp_bucket_a_step_gets_no_bucket_cap_advice():
    suggestion = ddp_advice(ddp_group(count=4, rank_steps=4, total_bytes=4 * 672 * 1024))
    assert "bucket_cap_mb" not in suggestion
    assert "already sends its gradients in one bucket a step" in suggestion
    assert ddp_buckets(collectives([ddp_group(4, 4, total_bytes=4 * 672 * 1024)])) == {
        "per_step": 1.0, "bytes": 672 * 1024}


def test_several_ddp_buckets_a_step_get_bucket_cap_advice():
    suggestion = ddp_advice(ddp_group(count=12, rank_steps=4))
    assert "With 3.0 gradient all-reduces per step (DDP buckets), tune bucket_cap_mb" in \
        suggestion
    assert "raise DDP's bucket_cap_mb" in suggestion  # most time under 1 MiB: coalesce


def test_one_large_ddp_bucket_is_told_to_split():
    suggestion = ddp_advice(ddp_group(count=4, rank_steps=4, bucket=16 * MIB,
                                      total_bytes=4 * 20 * MIB))
    assert "one 20.0 MiB bucket" in suggestion and "smaller bucket_cap_mb" in suggestion
    assert "raise" not in suggestion


def test_without_bucket_evidence_nothing_is_said_of_bucket_cap():
    group = ddp_group(count=4, rank_steps=0)
    assert ddp_buckets(collectives([group])) is None
    assert "bucket_cap_mb" not in ddp_advice(group)


def shaped_trace(rank, dims_per_step):
    """One aten::linear per step with the given input shapes."""
    rows = [event("aten::linear", "cpu_op", s * 10 * MS + MS, MS, input_dims=dims)
            for s, dims in enumerate(dims_per_step)]
    base = trace(rank, "gloo")
    base.events = events_frame(rows)
    base.steps = steps_frame([(s, s * 10 * MS, (s + 1) * 10 * MS)
                              for s in range(len(dims_per_step))])
    return reduced(base)


def test_input_shapes_vary_only_on_evidence():
    assert input_shapes_vary([shaped_trace(0, ["[[8, 128]]", "[[8, 512]]"])]) is True
    assert input_shapes_vary([shaped_trace(0, ["[[8, 128]]", "[[8, 128]]"])]) is False
    assert input_shapes_vary([shaped_trace(0, ["", ""])]) is None
    assert input_shapes_vary([trace(0)]) is None


def imbalance(traces):
    steps = per_step([step_row(r, s, compute=c, comm=0, overlap=10, exposed=0)
                      for s in range(4) for r, c in ((0, 50), (1, 80 if s % 2 else 20))])
    colls = collectives([collective("all_reduce", "0", 2, 256, 100, 0.1, issuer="ddp")])
    return finding(run(steps, colls=colls, traces=traces), "load imbalance across ranks")


def test_length_bucketing_only_for_variable_length_inputs():
    fixed = imbalance([shaped_trace(0, ["[[8, 128]]"] * 4), shaped_trace(1, ["[[8, 128]]"] * 4)])
    assert "length" not in fixed["suggestion"] and "drop_last=True" in fixed["suggestion"]
    unknown = imbalance([trace(0), trace(1)])
    assert "length" not in unknown["suggestion"]
    varying = imbalance([shaped_trace(0, ["[[8, 128]]", "[[8, 512]]"] * 2), trace(1)])
    assert "traced input shapes vary between steps" in varying["suggestion"]
    assert "bucket samples by length" in varying["suggestion"]


def test_idle_advice_speaks_of_the_device_only_on_gpu_traces():
    idle = gaps([(r, s, 20, "other") for r in (0, 1) for s in (0, 1)])

    def idle_finding(kind):
        steps = per_step([step_row(r, s, exposed=0, kind=kind) for r in (0, 1) for s in (0, 1)])
        return finding(run(steps, idle=idle), "idle: other host work" if kind == "cpu"
                       else "device idle: other host work")

    cpu, gpu = idle_finding("cpu"), idle_finding("gpu")
    assert "device" not in cpu["suggestion"].lower() and "device" not in cpu["evidence"].lower()
    assert cpu["evidence"].startswith("The training threads sat idle 20.00 ms per step")
    assert gpu["suggestion"].startswith("The device waited while the host ran something else")
    assert cpu["share_pct"] == gpu["share_pct"] == 20.0
    data = gaps([(r, s, 20, "data_loading") for r in (0, 1) for s in (0, 1)])
    steps = per_step([step_row(r, s, exposed=0, kind="cpu") for r in (0, 1) for s in (0, 1)])
    loading = finding(run(steps, idle=data), "idle: data loading")["suggestion"]
    assert "pin_memory" not in loading and "num_workers" in loading
