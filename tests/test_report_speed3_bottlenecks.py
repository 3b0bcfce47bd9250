"""analysis.findings.bottlenecks' array paths (the analysed steps, the ranked collective groups, the
early exits of the imbalance, bandwidth and memory findings) against hand-computed answers on
small built frames."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.findings import bottlenecks
from analysis.findings.bottlenecks import _exposed_communication, find_bottlenecks
from analysis.findings.inputs import analysed_steps as _analysed_steps
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS

MS = 1_000_000
MIB = 2**20


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
    steps = _analysed_steps(table)
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
    steps = _analysed_steps(table)
    assert steps["step_ns"].tolist() == [10.0] and steps["work_ns"].tolist() == [1.0]


def groups(rows) -> pd.DataFrame:
    return pd.DataFrame([{"op": op, "issuer": "c10d", "pg": "0", "pg_id": "0", "pg_size": 2,
                          "size_bucket": bucket, "bucket_min_bytes": float(low), "count": 10,
                          "total_us": total, "busbw_gbps": np.nan}
                         for op, bucket, low, total in rows])


def test_exposed_communication_ranks_groups_by_time_ties_in_table_order():
    steps = _analysed_steps(step_table(rank=[0, 1], step=[1, 1], step_ns=[100 * MS] * 2,
                                       compute=[0.0] * 2, overlap=[0.0] * 2, memcpy=[0.0] * 2,
                                       exposed=[50 * MS, 0.0]))
    table = groups([("broadcast", "1-2 MiB", MIB, 1000.0), ("all_gather", "1-2 MiB", MIB, 3000.0),
                    ("all_reduce", "1-2 MiB", MIB, 3000.0), ("reduce", "1-2 MiB", MIB, -5.0)])
    (finding,) = _exposed_communication(steps, table, pipeline=False)
    assert finding["share_pct"] == 25.0  # 50 ms exposed of 200 ms of steps
    assert finding["ranks"] == "0"
    # 3000 of 7000 us: 43%; the tie keeps table order; the negative group is left out
    assert ("torch.distributed all_gather pg 0 1-2 MiB x10 3.00 ms (43% of comm time); "
            "torch.distributed all_reduce pg 0 1-2 MiB x10 3.00 ms (43% of comm time); "
            "torch.distributed broadcast pg 0 1-2 MiB x10 1.00 ms (14% of comm time).") \
        in finding["evidence"]
    assert "25.00 ms of a 100.00 ms step" in finding["evidence"]


def test_exposed_communication_in_a_pipeline_scales_by_the_non_p2p_share():
    steps = _analysed_steps(step_table(rank=[0], step=[1], step_ns=[100 * MS], compute=[0.0],
                                       overlap=[0.0], memcpy=[0.0], exposed=[40 * MS]))
    table = groups([("send", "16-32 MiB", 16 * MIB, 3000.0), ("all_reduce", "16-32 MiB",
                                                                16 * MIB, 1000.0)])
    (finding,) = _exposed_communication(steps, table, pipeline=True)
    assert finding["share_pct"] == 10.0  # 40% exposed x 1000 / 4000 us outside send/recv
    assert "(100% of comm time)" in finding["evidence"]
    only_p2p = groups([("send", "16-32 MiB", 16 * MIB, 3000.0)])
    assert _exposed_communication(steps, only_p2p, pipeline=True) == []


def test_one_rank_has_no_imbalance_and_memory_below_capacity_no_finding():
    steps = _analysed_steps(step_table(rank=[3, 3], step=[1, 2], step_ns=[100 * MS, 300 * MS],
                                       compute=[100 * MS, 10 * MS], overlap=[0.0] * 2,
                                       memcpy=[0.0] * 2, exposed=[0.0] * 2))
    assert bottlenecks._imbalance(steps, pipeline=False) == []
    per_rank = pd.DataFrame({"rank": pd.array([0, 1], dtype="Int64"),
                             "peak_reserved_pct": [50.0, np.nan],
                             "device_used_pct": [95.0, 91.0]})
    # rank 0: reserved (50%) is what counts; rank 1: NVML's 91% without a reserved figure
    (finding,) = bottlenecks._memory_near_capacity(per_rank)
    assert finding["ranks"] == "1" and "rank 1: 91.0% in use (NVML)" in finding["evidence"]
    per_rank["device_used_pct"] = [95.0, 89.0]
    assert bottlenecks._memory_near_capacity(per_rank) == []


def test_low_bus_bandwidth_ignores_barriers_and_small_messages():
    steps = _analysed_steps(step_table(rank=[0], step=[1], step_ns=[100 * MS], compute=[0.0],
                                       overlap=[0.0], memcpy=[0.0], exposed=[0.0]))
    steps["comm_only_ns"] = 50.0 * MS
    table = groups([("barrier", "16-32 MiB", 16 * MIB, 3000.0),
                    ("all_reduce", "1-2 MiB", MIB, 1000.0)])
    table["busbw_gbps"] = 1.0
    assert bottlenecks._low_bus_bandwidth(steps, "gpu", table) == []
    table.loc[1, ["size_bucket", "bucket_min_bytes"]] = ["16-32 MiB", 16.0 * MIB]
    (finding,) = bottlenecks._low_bus_bandwidth(steps, "gpu", table)
    # saves 1000 * (1 - 1/5) of 4000 us of comm, times 50% of step time spent communicating
    assert finding["share_pct"] == 10.0


def test_find_bottlenecks_on_a_one_rank_run():
    table = step_table(rank=[0, 0], step=[1, 2], step_ns=[100 * MS] * 2, compute=[10 * MS] * 2,
                       overlap=[0.0] * 2, memcpy=[0.0] * 2, exposed=[60 * MS, 40 * MS])
    found = find_bottlenecks(table, pd.DataFrame(), groups([("all_reduce", "?", np.nan, 10.0)]),
                             pd.DataFrame(), [])
    assert found["finding"].tolist() == ["exposed communication"]
    assert found["share_pct"].tolist() == [50.0]
