"""analysis.findings.bottlenecks: each finding fires on inputs with a known share, and not below its
threshold."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.findings import bottlenecks, resource_findings
from analysis.findings.bottlenecks import (
    FINDING_COLUMNS,
    find_bottlenecks,
    is_pipeline_run,
    rank_list,
)
from analysis.findings.inputs import analysed_steps
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS
from helpers.findings_inputs import (
    GIB,
    MIB,
    MS,
    balanced,
    collective,
    collectives,
    finding,
    gaps,
    memory_rank,
    per_step,
    run,
    step_row,
    trace,
)


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


# ---- the analysed steps, and findings on one rank or few groups -------------------------------
def step_table(rank, step, step_ns, compute, overlap, memcpy, exposed) -> pd.DataFrame:
    frame = pd.DataFrame({"rank": pd.array(rank, dtype="Int64"),
                          "step": pd.array(step, dtype="Int64"),
                          "step_ns": np.array(step_ns, dtype=np.float64)})
    for column in BREAKDOWN_NS_COLUMNS[1:]:
        frame[column] = 0.0
    frame["compute_only_ns"] = np.array(compute, dtype=np.float64)
    frame["overlap_ns"] = np.array(overlap, dtype=np.float64)
    frame["memcpy_ns"] = np.array(memcpy, dtype=np.float64)
    frame["exposed_comm_ns"] = np.array(exposed, dtype=np.float64)
    frame["kind"] = "gpu"
    return frame


def test_analysed_steps_drop_rows_without_rank_step_or_time_and_sum_work():
    nan = np.nan
    table = step_table(rank=[0, None, 1, 1, 0], step=[1, 1, None, 2, 2],
                       step_ns=[10.0, 10.0, 10.0, 0.0, 20.0],
                       compute=[1.0, 1.0, 1.0, 1.0, nan], overlap=[2.0, 2.0, 2.0, 2.0, nan],
                       memcpy=[nan, 0.0, 0.0, 0.0, nan], exposed=[3.0, 0, 0, 0, 4.0])
    steps = analysed_steps(table)
    assert list(steps.columns) == ["rank", "step", *BREAKDOWN_NS_COLUMNS, "work_ns"]
    assert all(steps[c].dtype == np.float64 for c in steps.columns)
    assert steps.index.equals(pd.RangeIndex(2))
    assert steps["rank"].tolist() == [0.0, 0.0] and steps["step"].tolist() == [1.0, 2.0]
    # 1 + 2 with the missing memcpy as 0; every part missing: NaN, as a sum with min_count=1
    assert steps["work_ns"].iloc[0] == 3.0 and np.isnan(steps["work_ns"].iloc[1])
    assert steps["exposed_comm_ns"].tolist() == [3.0, 4.0]


def test_analysed_steps_of_text_columns_are_converted_as_before():
    table = step_table(rank=[0], step=[1], step_ns=[10.0], compute=[1.0], overlap=[0.0],
                       memcpy=[0.0], exposed=[0.0])
    table["step_ns"] = ["10"]  # not numeric: pandas' conversion path
    steps = analysed_steps(table)
    assert steps["step_ns"].tolist() == [10.0] and steps["work_ns"].tolist() == [1.0]


def groups(rows) -> pd.DataFrame:
    return pd.DataFrame([{"op": op, "issuer": "c10d", "pg": "0", "pg_id": "0", "pg_size": 2,
                          "size_bucket": bucket, "bucket_min_bytes": float(low), "count": 10,
                          "total_us": total, "busbw_gbps": np.nan}
                         for op, bucket, low, total in rows])


def test_exposed_communication_ranks_groups_by_time_ties_in_table_order():
    steps = analysed_steps(step_table(rank=[0, 1], step=[1, 1], step_ns=[100 * MS] * 2,
                                       compute=[0.0] * 2, overlap=[0.0] * 2, memcpy=[0.0] * 2,
                                       exposed=[50 * MS, 0.0]))
    table = groups([("broadcast", "1-2 MiB", MIB, 1000.0), ("all_gather", "1-2 MiB", MIB, 3000.0),
                    ("all_reduce", "1-2 MiB", MIB, 3000.0), ("reduce", "1-2 MiB", MIB, -5.0)])
    (finding,) = bottlenecks._exposed_communication(steps, table, pipeline=False)
    assert finding.share_pct == 25.0  # 50 ms exposed of 200 ms of steps
    assert finding.ranks == "0"
    # 3000 of 7000 us: 43%; the tie keeps table order; the negative group is left out
    assert ("torch.distributed all_gather pg 0 1-2 MiB x10 3.00 ms (43% of comm time); "
            "torch.distributed all_reduce pg 0 1-2 MiB x10 3.00 ms (43% of comm time); "
            "torch.distributed broadcast pg 0 1-2 MiB x10 1.00 ms (14% of comm time).") \
        in finding.evidence
    assert "25.00 ms of a 100.00 ms step" in finding.evidence


def test_exposed_communication_in_a_pipeline_scales_by_the_non_p2p_share():
    steps = analysed_steps(step_table(rank=[0], step=[1], step_ns=[100 * MS], compute=[0.0],
                                       overlap=[0.0], memcpy=[0.0], exposed=[40 * MS]))
    table = groups([("send", "16-32 MiB", 16 * MIB, 3000.0), ("all_reduce", "16-32 MiB",
                                                                16 * MIB, 1000.0)])
    (finding,) = bottlenecks._exposed_communication(steps, table, pipeline=True)
    assert finding.share_pct == 10.0  # 40% exposed x 1000 / 4000 us outside send/recv
    assert "(100% of comm time)" in finding.evidence
    only_p2p = groups([("send", "16-32 MiB", 16 * MIB, 3000.0)])
    assert bottlenecks._exposed_communication(steps, only_p2p, pipeline=True) == []


def test_one_rank_has_no_imbalance_and_memory_below_capacity_no_finding():
    steps = analysed_steps(step_table(rank=[3, 3], step=[1, 2], step_ns=[100 * MS, 300 * MS],
                                       compute=[100 * MS, 10 * MS], overlap=[0.0] * 2,
                                       memcpy=[0.0] * 2, exposed=[0.0] * 2))
    assert bottlenecks._imbalance(steps, pipeline=False) == []
    per_rank = pd.DataFrame({"rank": pd.array([0, 1], dtype="Int64"),
                             "peak_reserved_pct": [50.0, np.nan],
                             "device_used_pct": [95.0, 91.0]})
    # rank 0: reserved (50%) is what counts; rank 1: NVML's 91% without a reserved figure
    (finding,) = resource_findings._memory_near_capacity(per_rank)
    assert finding.ranks == "1" and "rank 1: 91.0% in use (NVML)" in finding.evidence
    per_rank["device_used_pct"] = [95.0, 89.0]
    assert resource_findings._memory_near_capacity(per_rank) == []


def test_low_bus_bandwidth_ignores_barriers_and_small_messages():
    steps = analysed_steps(step_table(rank=[0], step=[1], step_ns=[100 * MS], compute=[0.0],
                                       overlap=[0.0], memcpy=[0.0], exposed=[0.0]))
    steps["comm_only_ns"] = 50.0 * MS
    table = groups([("barrier", "16-32 MiB", 16 * MIB, 3000.0),
                    ("all_reduce", "1-2 MiB", MIB, 1000.0)])
    table["busbw_gbps"] = 1.0
    assert resource_findings._low_bus_bandwidth(steps, "gpu", table) == []
    table.loc[1, ["size_bucket", "bucket_min_bytes"]] = ["16-32 MiB", 16.0 * MIB]
    (finding,) = resource_findings._low_bus_bandwidth(steps, "gpu", table)
    # saves 1000 * (1 - 1/5) of 4000 us of comm, times 50% of step time spent communicating
    assert finding.share_pct == 10.0


def test_find_bottlenecks_on_a_one_rank_run():
    table = step_table(rank=[0, 0], step=[1, 2], step_ns=[100 * MS] * 2, compute=[10 * MS] * 2,
                       overlap=[0.0] * 2, memcpy=[0.0] * 2, exposed=[60 * MS, 40 * MS])
    found = find_bottlenecks(table, pd.DataFrame(), groups([("all_reduce", "?", np.nan, 10.0)]),
                             pd.DataFrame(), [])
    assert found["finding"].tolist() == ["exposed communication"]
    assert found["share_pct"].tolist() == [50.0]


def test_analysed_steps_read_an_absent_time_as_missing_and_a_rank_not_known_as_none():
    table = step_table(rank=[0, 1], step=[1, 1], step_ns=[10.0, 20.0], compute=[1.0, 2.0],
                       overlap=[0.0, 0.0], memcpy=[1.0, 1.0], exposed=[0.0, 0.0])
    table = table.drop(columns=["exposed_comm_ns"]).astype({"rank": object})
    table.loc[1, "rank"] = None
    steps = analysed_steps(table)
    assert steps["rank"].tolist() == [0.0] and steps["work_ns"].tolist() == [2.0]
    assert np.isnan(steps["exposed_comm_ns"].iloc[0])
    empty = analysed_steps(table.iloc[:0])
    assert empty.empty and list(empty.columns) == list(steps.columns)
