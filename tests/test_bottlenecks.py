"""analysis.findings.bottlenecks: each finding fires on inputs with a known share, and not below its
threshold."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.findings.bottlenecks import (
    FINDING_COLUMNS,
    find_bottlenecks,
    is_pipeline_run,
    rank_list,
)
from analysis.ingest.load import RankTrace, RunRecords
from analysis.rank.comm.ops import COLLECTIVES_COLUMNS
from tracer import schema

MS = 1_000_000
MIB = 2**20
GIB = 2**30


def step_row(rank, step, *, step_ms=100, compute=60, comm=10, overlap=10, memcpy=0, idle=None,
             exposed=None, kind="gpu") -> dict:
    idle = step_ms - compute - comm - overlap - memcpy if idle is None else idle
    return {"rank": rank, "step": step, "step_ns": step_ms * MS, "compute_only_ns": compute * MS,
            "comm_only_ns": comm * MS, "overlap_ns": overlap * MS, "memcpy_ns": memcpy * MS,
            "idle_ns": idle * MS, "exposed_comm_ns": (comm if exposed is None else exposed) * MS,
            "overlap_pct": np.nan, "kind": kind}


def per_step(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


def collective(op, pg, pg_size, bucket_min, total_us, busbw, *, count=10, rank_steps=4,
               issuer=None, pg_id=None) -> dict:
    label = {1 * MIB: "1-2 MiB", 8 * MIB: "8-16 MiB", 16 * MIB: "16-32 MiB",
             256: "256-512 B"}.get(bucket_min, "?")
    return {"op": op, "issuer": issuer, "pg": pg, "pg_id": pg if pg_id is None else pg_id,
            "pg_size": pg_size, "size_bucket": label,
            "bucket_min_bytes": float(bucket_min), "count": count, "total_bytes": np.nan,
            "total_us": float(total_us), "mean_us": total_us / count, "algbw_gbps": np.nan,
            "busbw_gbps": float(busbw), "ranks": 2, "rank_steps": rank_steps,
            "slowest_rank": pd.NA, "slowest_rank_busbw_gbps": np.nan}


def collectives(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLLECTIVES_COLUMNS)


def gaps(rows) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "step": s, "start_ns": 0, "end_ns": d * MS, "dur_ns": d * MS,
                          "host_activity": a} for r, s, d, a in rows])


def trace(rank, backend="nccl", script=None) -> RankTrace:
    manifest = []
    if script is not None:
        manifest.append(schema.RunStart(
            schema_version=1, run_name="t", rank=rank, local_rank=rank, world_size=2, host="h",
            pid=1, start_ns=0, argv=[script], script=script, script_args=[], torch_version="2",
            config={}))
    records = RunRecords(comms=pd.DataFrame(), samples=pd.DataFrame(), steps=pd.DataFrame(),
                         manifest=manifest)
    return RankTrace(rank=rank, world_size=2, path=Path(f"rank{rank}.1.pt.trace.json.gz"),
                     events=pd.DataFrame(), steps=pd.DataFrame(), records=records, problems=[],
                     backend=backend)


def run(steps=None, per_rank=None, colls=None, idle=None, traces=None) -> pd.DataFrame:
    result = find_bottlenecks(steps if steps is not None else per_step([]),
                              per_rank if per_rank is not None else pd.DataFrame(),
                              colls if colls is not None else collectives([]),
                              idle if idle is not None else gaps([]),
                              traces if traces is not None else [trace(0), trace(1)])
    assert list(result.columns) == FINDING_COLUMNS
    return result


def finding(result: pd.DataFrame, name: str) -> pd.Series:
    rows = result[result["finding"] == name]
    assert len(rows) == 1, f"{name!r} not in {result['finding'].tolist()}"
    return rows.iloc[0]


def balanced(exposed) -> pd.DataFrame:
    return per_step([step_row(r, s, exposed=exposed) for r in (0, 1) for s in (0, 1)])


# ---- exposed communication ----------------------------------------------------------------------
def test_exposed_communication_names_the_top_collectives():
    colls = collectives([
        collective("all_reduce", "0", 2, 16 * MIB, 60_000, 20.0, issuer="ddp"),
        collective("broadcast", "0", 2, 256, 10_000, 0.1, issuer="ddp"),
    ])
    result = run(balanced(exposed=20), colls=colls)
    row = finding(result, "exposed communication")
    assert row["share_pct"] == pytest.approx(20.0)
    assert "20.00 ms of a 100.00 ms step" in row["evidence"]
    assert "DDP all_reduce pg 0 16-32 MiB x10 60.00 ms (86% of comm time" in row["evidence"]
    assert "bucket_cap_mb" in row["suggestion"]
    assert row["ranks"] == "0-1"


def test_exposed_communication_below_threshold_is_quiet():
    result = run(balanced(exposed=4),
                 colls=collectives([collective("all_reduce", "0", 2, 16 * MIB, 1_000, 20.0)]))
    assert "exposed communication" not in result["finding"].tolist()


def test_small_messages_get_the_coalescing_hint():
    colls = collectives([collective("all_gather", "0", 2, 256, 50_000, 0.1, issuer="fsdp1"),
                         collective("all_gather", "0", 2, 16 * MIB, 10_000, 20.0, issuer="fsdp1")])
    row = finding(run(balanced(exposed=10), colls=colls), "exposed communication")
    assert "FSDP" in row["suggestion"] and "coalesce" in row["suggestion"]


def test_pipeline_leaves_send_recv_to_the_bubble():
    colls = collectives([collective("send", "0", 2, 8 * MIB, 30_000, 20.0),
                         collective("recv", "0", 2, 8 * MIB, 30_000, 20.0),
                         collective("all_reduce", "1", 2, 8 * MIB, 20_000, 20.0)])
    result = run(balanced(exposed=40), colls=colls)
    row = finding(result, "exposed communication")
    assert row["share_pct"] == pytest.approx(40 * 20_000 / 80_000)  # 10%
    assert "send/recv excluded" in row["evidence"]
    assert "all_reduce pg 1" in row["evidence"] and "send pg" not in row["evidence"]
    assert "pipeline bubble" in result["finding"].tolist()


# ---- device idle by host activity ---------------------------------------------------------------
def test_device_idle_is_split_by_host_activity():
    steps = balanced(exposed=0)  # 4 steps of 100 ms
    idle = gaps([
        (0, 0, 10, "data_loading"), (0, 1, 10, "data_loading"), (1, 0, 10, "data_loading"),
        (1, 1, 10, "data_loading"),
        (0, 0, 12, "synchronisation"),  # 3%: below the threshold
        (1, 0, 15, "launch_bound"), (1, 1, 5, "launch_bound"),  # 5%, all on rank 1
        (0, 9, 100, "data_loading"),  # a step outside the analysed ones
    ])
    result = run(steps, idle=idle)
    loading = finding(result, "device idle: data loading")
    assert loading["share_pct"] == pytest.approx(10.0)
    assert "in 4 gaps" in loading["evidence"] and "10.00 ms per step" in loading["evidence"]
    assert "num_workers" in loading["suggestion"] and "pin_memory" in loading["suggestion"]
    assert loading["ranks"] == "0-1"
    launch = finding(result, "device idle: launch bound")
    assert launch["share_pct"] == pytest.approx(5.0)
    assert launch["ranks"] == "1"
    assert "longest gap was 15.00 ms on rank 1, step 0" in launch["evidence"]
    assert "while the host was still launching the kernels" in launch["evidence"]
    assert "CUDA graphs" in launch["suggestion"]
    assert "device idle: synchronisation" not in result["finding"].tolist()


def test_idle_on_cpu_traces_is_the_training_threads():
    steps = per_step([step_row(r, s, kind="cpu", exposed=0) for r in (0, 1) for s in (0, 1)])
    result = run(steps, idle=gaps([(r, s, 10, "data_loading") for r in (0, 1) for s in (0, 1)]),
                 traces=[trace(0, "gloo"), trace(1, "gloo")])
    row = finding(result, "idle: data loading")
    assert row["share_pct"] == pytest.approx(10.0)
    assert row["evidence"].startswith("The training threads sat idle 10.00 ms per step")

def test_synchronisation_gaps_suggest_removing_syncs():
    result = run(balanced(exposed=0), idle=gaps([(r, s, 30, "synchronisation")
                                                 for r in (0, 1) for s in (0, 1)]))
    row = finding(result, "device idle: synchronisation")
    assert row["share_pct"] == pytest.approx(30.0)
    assert ".item()" in row["suggestion"]


# ---- imbalance and stragglers -------------------------------------------------------------------
def test_a_rank_with_more_work_every_step_is_a_straggler():
    # Rank 0 works 70 + 10 = 80 ms, rank 1 50 + 10 = 60 ms: the mean rank waits 80 - 70 = 10 ms.
    steps = per_step([step_row(0, s, compute=70, comm=5, exposed=5) for s in range(3)]
                     + [step_row(1, s, compute=50, comm=25, exposed=25) for s in range(3)])
    row = finding(run(steps), "straggler: rank 0")
    assert row["share_pct"] == pytest.approx(10.0)
    assert "works 80.00 ms against a mean of 70.00 ms" in row["evidence"]
    assert "most work in 3 of 3 steps, 14.3% above the mean" in row["evidence"]
    assert row["ranks"] == "0"
    assert "nvidia-smi" in row["suggestion"]
    cpu = finding(run(steps, traces=[trace(0, "gloo"), trace(1, "gloo")]), "straggler: rank 0")
    assert "OMP_NUM_THREADS" in cpu["suggestion"] and "nvidia-smi" not in cpu["suggestion"]


def test_alternating_heavy_ranks_are_imbalance_not_a_straggler():
    rows = []
    for s in range(4):
        heavy = s % 2
        rows += [step_row(heavy, s, compute=70), step_row(1 - heavy, s, compute=50)]
    result = run(per_step(rows))
    row = finding(result, "load imbalance across ranks")
    assert row["share_pct"] == pytest.approx(10.0)
    assert not result["finding"].str.startswith("straggler").any()


def test_nearly_balanced_ranks_raise_nothing():
    steps = per_step([step_row(0, s, compute=70) for s in range(3)]
                     + [step_row(1, s, compute=68) for s in range(3)])
    result = run(steps)
    assert not result["finding"].str.contains("imbalance|straggler").any()


# ---- pipeline bubble ----------------------------------------------------------------------------
def test_pipeline_bubble_per_stage_from_the_manifest_script():
    steps = per_step([step_row(0, s, compute=60, overlap=10, exposed=0) for s in range(2)]
                     + [step_row(1, s, compute=40, overlap=10, exposed=0) for s in range(2)])
    traces = [trace(0, "gloo", "workloads/pipeline.py"), trace(1, "gloo", "workloads/pipeline.py")]
    result = run(steps, traces=traces)
    row = finding(result, "pipeline bubble")
    assert row["share_pct"] == pytest.approx((30 + 50) / 2)
    assert "rank 0 30.0%, rank 1 50.0%" in row["evidence"]
    assert "p=2 stages (m=2: 33%, m=8: 11%)" in row["suggestion"]
    assert "move layers from rank 0 towards rank 1" in row["suggestion"]


def test_no_bubble_finding_outside_pipelines():
    steps = per_step([step_row(r, s, compute=40) for r in (0, 1) for s in (0, 1)])
    result = run(steps, colls=collectives([collective("all_reduce", "0", 2, 8 * MIB, 1, 20.0)]))
    assert "pipeline bubble" not in result["finding"].tolist()


def test_pipeline_detection():
    p2p = collectives([collective("recv", "0", 2, 256, 10, 0.1)])
    assert is_pipeline_run(p2p, [])
    assert is_pipeline_run(collectives([]), [trace(0, script="/x/train_pipe.py")])
    assert not is_pipeline_run(collectives([]), [trace(0, script="/x/ddp.py")])
    assert not is_pipeline_run(collectives([collective("all_reduce", "0", 2, 256, 10, 0.1)]), None)


# ---- low bus bandwidth --------------------------------------------------------------------------
def test_low_bus_bandwidth_against_floor_and_peers():
    steps = balanced(exposed=0)  # communication (comm only + overlap) is 20% of each step
    colls = collectives([
        # Under NCCL's 5 GB/s floor: at 5 GB/s it would take 30 ms * 2/5, saving 18 ms.
        collective("all_reduce", "0", 2, 16 * MIB, 30_000, 2.0),
        # Under half of pg 2's 40 GB/s for the same op, size and bucket: saves 12 ms * 3/4 = 9 ms.
        collective("all_gather", "1", 8, 8 * MIB, 12_000, 10.0),
        collective("all_gather", "2", 8, 8 * MIB, 12_000, 40.0),
        # Small messages are latency-bound and never judged.
        collective("broadcast", "0", 2, 256, 46_000, 0.001),
    ])
    row = finding(run(steps, colls=colls), "low bus bandwidth")
    # 27 ms saved of 100 ms of collective time, which is 20% of step time.
    assert row["share_pct"] == pytest.approx(27_000 / 100_000 * 20)
    assert "all_reduce pg 0 16-32 MiB: busbw 2.00 GB/s, under the 5 GB/s floor" in row["evidence"]
    assert "all_gather pg 1 8-16 MiB: busbw 10.00 GB/s, under half of 40.00 GB/s" in row["evidence"]
    assert "pg 2" not in row["evidence"] and "broadcast" not in row["evidence"]
    assert "NCCL_DEBUG=INFO" in row["suggestion"]


def test_bandwidth_is_judged_per_backend():
    steps = balanced(exposed=0)
    colls = collectives([collective("all_reduce", "0", 2, 16 * MIB, 30_000, 0.5)])
    gpu = run(steps, colls=colls, traces=[trace(0, "nccl")])
    assert finding(gpu, "low bus bandwidth")["share_pct"] == pytest.approx((1 - 0.5 / 5) * 20)
    cpu = run(steps, colls=colls, traces=[trace(0, "gloo")])
    assert "low bus bandwidth" not in cpu["finding"].tolist()  # 0.5 GB/s is fine for gloo


def test_the_bandwidth_share_stays_within_step_time():
    # Records cover many more steps than the profiled ones: the share is still a share.
    steps = per_step([step_row(0, 0, compute=10, comm=80, overlap=10)])
    colls = collectives([collective("all_reduce", "0", 2, 16 * MIB, 9_000_000, 0.05,
                                    rank_steps=1)])
    row = finding(run(steps, colls=colls, traces=[trace(0, "gloo")]), "low bus bandwidth")
    assert row["share_pct"] == pytest.approx((1 - 0.05 / 0.1) * 90)


def test_good_or_costless_bandwidth_raises_nothing():
    steps = balanced(exposed=0)
    fine = collectives([collective("all_reduce", "0", 2, 16 * MIB, 30_000, 8.0)])
    assert "low bus bandwidth" not in run(steps, colls=fine)["finding"].tolist()
    # Below the floor, but reaching it saves 2% of collective time: 0.4% of step time.
    cheap = collectives([collective("all_reduce", "0", 2, 16 * MIB, 30_000, 4.9)])
    assert "low bus bandwidth" not in run(steps, colls=cheap)["finding"].tolist()


# ---- memory -------------------------------------------------------------------------------------
def memory_rank(rank, reserved_gib, allocated_gib, total_gib=40) -> dict:
    return {"rank": rank, "kind": "gpu", "peak_reserved_bytes": reserved_gib * GIB,
            "peak_allocated_bytes": allocated_gib * GIB, "device_total_bytes": total_gib * GIB,
            "peak_reserved_pct": reserved_gib / total_gib * 100, "device_used_pct": np.nan,
            "peak_device_used_bytes": np.nan}


def test_memory_near_capacity_and_fragmentation():
    per_rank = pd.DataFrame([memory_rank(0, 38, 30), memory_rank(1, 34, 33)])
    row = finding(run(balanced(exposed=0), per_rank=per_rank), "memory near capacity")
    assert math.isnan(row["share_pct"])
    assert row["ranks"] == "0"
    assert ("95.0% reserved by PyTorch (38.00 of 40.00 GiB), peak allocated 30.00 GiB"
            in row["evidence"])
    assert "checkpointing" in row["suggestion"]
    assert "expandable_segments" in row["suggestion"]  # 8 GiB of 40 reserved but unallocated


def test_memory_uses_nvml_when_the_allocator_is_silent():
    per_rank = pd.DataFrame([{"rank": 0, "kind": "gpu", "peak_reserved_pct": np.nan,
                              "device_used_pct": 97.5, "peak_device_used_bytes": 39 * GIB,
                              "device_total_bytes": np.nan}])
    row = finding(run(balanced(exposed=0), per_rank=per_rank), "memory near capacity")
    assert "97.5% in use (NVML)" in row["evidence"]


def test_memory_at_ninety_percent_is_not_flagged():
    per_rank = pd.DataFrame([memory_rank(0, 36, 35)])  # exactly 90%
    found = run(balanced(exposed=0), per_rank=per_rank)["finding"].tolist()
    assert "memory near capacity" not in found


# ---- the table ----------------------------------------------------------------------------------
def test_findings_sorted_by_share_with_memory_last():
    colls = collectives([collective("all_reduce", "0", 2, 16 * MIB, 60_000, 20.0)])
    idle = gaps([(r, s, 10, "data_loading") for r in (0, 1) for s in (0, 1)])
    per_rank = pd.DataFrame([memory_rank(0, 39, 38)])
    result = run(balanced(exposed=20), per_rank=per_rank, colls=colls, idle=idle)
    assert result["finding"].tolist() == ["exposed communication", "device idle: data loading",
                                          "memory near capacity"]
    assert result["share_pct"].iloc[:2].tolist() == pytest.approx([20.0, 10.0])


def test_a_healthy_run_has_no_findings():
    colls = collectives([collective("all_reduce", "0", 2, 16 * MIB, 1_000, 50.0)])
    result = run(balanced(exposed=1), per_rank=pd.DataFrame([memory_rank(0, 20, 19)]), colls=colls,
                 idle=gaps([(0, 0, 1, "other")]))
    assert result.empty


@pytest.mark.parametrize("steps", [None, pd.DataFrame(), pd.DataFrame({"rank": [0], "step": [0]}),
                                   per_step([{"rank": 0, "step": 0, "step_ns": np.nan}])])
def test_bad_input_gives_an_empty_frame(steps):
    result = find_bottlenecks(steps, None, None, None, None)
    assert result.empty and list(result.columns) == FINDING_COLUMNS


def test_rank_list_compresses_ranges():
    assert rank_list([5, 0, 1, 2, 7, 8, 2, np.nan]) == "0-2, 5, 7-8"
    assert rank_list([]) == ""


def test_rank_busiest_most_often_but_lighter_on_average_is_not_a_straggler():
    # Rank 1 works more in steps 1 and 2, but rank 0's long step 0 makes rank 0 the heavier on
    # average (mean work 53.3 vs 40 ms): imbalance, and no straggler named rank 1.
    rows = []
    for s, (work0, work1) in enumerate(((80, 40), (30, 40), (30, 40))):
        rows += [step_row(0, s, compute=work0, comm=0, overlap=0, exposed=0),
                 step_row(1, s, compute=work1, comm=0, overlap=0, exposed=0)]
    result = run(per_step(rows))
    assert not result["finding"].str.startswith("straggler").any()
    # waits: 80-60=20, 40-35=5, 40-35=5 -> 30 ms of 300 ms of mean step time
    assert finding(result, "load imbalance across ranks")["share_pct"] == pytest.approx(10.0)
