"""analysis.rank.tables: per-step and per-rank tables with memory, utilisation and rank spread."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.ingest.load import RankTrace, RunRecords
from analysis.rank.tables import PER_RANK_COLUMNS, PER_STEP_COLUMNS, per_rank_table, per_step_table

MS = 1_000_000
HOST_T0 = 1_700_000_000_000_000_000  # host clock (time.time_ns()), far from any trace timebase
GIB = 2**30


def breakdown_row(rank, step, step_ms, compute, comm, overlap, memcpy, idle, exposed=None,
                  kind="gpu") -> dict:
    return {"rank": rank, "step": step, "step_ns": step_ms * MS, "compute_only_ns": compute * MS,
            "comm_only_ns": comm * MS, "overlap_ns": overlap * MS, "memcpy_ns": memcpy * MS,
            "idle_ns": idle * MS, "exposed_comm_ns": (comm if exposed is None else exposed) * MS,
            "overlap_pct": np.nan, "kind": kind}


def make_trace(rank, records=None) -> RankTrace:
    # Trace steps in the trace's own timebase (tiny numbers): joining samples through them
    # would find nothing.
    steps = pd.DataFrame({"step": [0, 1, 2], "start_ns": [0, 100 * MS, 200 * MS],
                          "end_ns": [100 * MS, 200 * MS, 300 * MS]})
    return RankTrace(rank=rank, world_size=2, path=Path(f"rank{rank}.1.pt.trace.json.gz"),
                     events=pd.DataFrame(), steps=steps, records=records, problems=[])


def step_records(rank, rows) -> pd.DataFrame:
    return pd.DataFrame([{"rank": rank, **row} for row in rows])


def gpu_records(rank, reserved_gib, allocated_gib, util_by_step) -> RunRecords:
    """Three 100 ms steps on the host clock; NVML samples with the given sm_util per step."""
    steps, samples = [], []
    for step in range(3):
        start = HOST_T0 + step * 100 * MS
        steps.append({"step": step, "start_ns": start, "end_ns": start + 100 * MS,
                      "cuda_peak_allocated_bytes": int(allocated_gib[step] * GIB),
                      "cuda_peak_reserved_bytes": int(reserved_gib[step] * GIB),
                      "cuda_total_bytes": 40 * GIB})
        for offset, util in zip((10 * MS, 50 * MS, 100 * MS), util_by_step[step]):
            samples.append({"rank": rank, "t_ns": start + offset, "source": "nvml", "device": rank,
                            "sm_util_pct": util, "mem_used_bytes": 30 * GIB,
                            "mem_total_bytes": 40 * GIB})
    # A sample between steps' ends and a far one outside every step.
    samples.append({"rank": rank, "t_ns": HOST_T0 + 10_000 * MS, "source": "nvml",
                    "sm_util_pct": 0.0, "mem_used_bytes": 39 * GIB, "mem_total_bytes": 40 * GIB})
    return RunRecords(comms=pd.DataFrame(), samples=pd.DataFrame(samples),
                      steps=step_records(rank, steps), manifest=[])


@pytest.fixture
def two_ranks():
    per_step = pd.DataFrame([
        breakdown_row(0, 0, 100, 60, 10, 10, 0, 20),
        breakdown_row(0, 1, 100, 60, 10, 10, 0, 20),
        breakdown_row(0, 2, 100, 60, 10, 10, 0, 20),
        breakdown_row(1, 0, 120, 80, 10, 10, 0, 20),
        breakdown_row(1, 1, 140, 80, 20, 10, 10, 20),
        breakdown_row(1, 2, 90, 50, 10, 10, 0, 20),
    ])
    traces = [
        # Samples 10 ms and 50 ms into each step and at its end; a window holds both its ends.
        make_trace(0, gpu_records(0, [10, 12, 11], [8, 9, 9],
                                  [(10, 20, 30), (40, 50, 60), (70, 80, 90)])),
        make_trace(1, gpu_records(1, [20, 38, 21], [15, 30, 16],
                                  [(100, 100, 100), (0, 0, 30), (50, 50, 50)])),
    ]
    return per_step, traces


def test_per_step_joins_memory_and_samples_by_host_clock(two_ranks):
    table = per_step_table(*two_ranks)
    assert list(table.columns[:len(PER_STEP_COLUMNS)]) == PER_STEP_COLUMNS
    row = table[(table["rank"] == 0) & (table["step"] == 1)].iloc[0]
    assert row["peak_reserved_bytes"] == 12 * GIB
    assert row["peak_allocated_bytes"] == 9 * GIB
    assert row["device_total_bytes"] == 40 * GIB
    # Step 1 holds its own three samples plus step 0's end sample (same instant as its start).
    assert row["sm_util_pct"] == pytest.approx((30 + 40 + 50 + 60) / 4)
    assert row["util_samples"] == 4
    assert row["work_ns"] == 70 * MS
    assert math.isnan(row["cpu_process_pct"])


def test_per_step_spread_across_ranks(two_ranks):
    table = per_step_table(*two_ranks)
    step1 = table[table["step"] == 1]
    assert set(step1["ranks_max_step_ns"]) == {140 * MS}
    assert set(step1["ranks_min_step_ns"]) == {100 * MS}
    assert set(step1["ranks_mean_step_ns"]) == {120 * MS}
    assert set(step1["slowest_rank"]) == {1}
    assert step1["imbalance_pct"].iloc[0] == pytest.approx((140 - 120) / 120 * 100)
    step2 = table[table["step"] == 2]
    assert set(step2["slowest_rank"]) == {0}


def test_per_rank_statistics(two_ranks):
    table = per_rank_table(*two_ranks)
    assert list(table.columns) == PER_RANK_COLUMNS
    assert table["rank"].tolist() == [0, 1]
    one = table.iloc[1]
    assert one["steps"] == 3 and one["kind"] == "gpu"
    assert one["mean_step_ns"] == pytest.approx(350 / 3 * MS)
    assert one["median_step_ns"] == 120 * MS
    assert (one["min_step_ns"], one["max_step_ns"]) == (90 * MS, 140 * MS)
    assert one["compute_only_ns"] == pytest.approx(70 * MS)
    assert one["work_ns"] == pytest.approx((90 + 100 + 60) / 3 * MS)
    assert one["idle_pct"] == pytest.approx(60 / 350 * 100)
    assert one["exposed_comm_pct"] == pytest.approx(40 / 350 * 100)
    # Peaks over every recorded step; utilisation over samples inside any step.
    assert one["peak_reserved_bytes"] == 38 * GIB
    assert one["peak_reserved_pct"] == pytest.approx(38 / 40 * 100)
    assert one["peak_allocated_bytes"] == 30 * GIB
    assert one["sm_util_pct"] == pytest.approx((300 + 30 + 150) / 9)
    # NVML's peak includes the sample outside the steps.
    assert one["device_used_pct"] == pytest.approx(39 / 40 * 100)
    assert one["slowdown_vs_fastest_pct"] == pytest.approx((350 / 3 - 100) / 100 * 100)
    assert table["slowest"].tolist() == [False, True]


def test_cpu_run_uses_process_cpu_and_rss():
    per_step = pd.DataFrame([breakdown_row(0, 0, 50, 40, 5, 0, 0, 5, kind="cpu")])
    records = RunRecords(
        comms=pd.DataFrame(),
        samples=pd.DataFrame([{"rank": 0, "t_ns": HOST_T0 + t * MS, "source": "psutil",
                               "cpu_process_pct": pct, "rss_bytes": 2 * GIB}
                              for t, pct in ((10, 150.0), (40, 50.0), (60, 400.0))]),
        steps=step_records(0, [{"step": 0, "start_ns": HOST_T0, "end_ns": HOST_T0 + 50 * MS,
                                "rss_bytes": 3 * GIB}]),
        manifest=[])
    steps = per_step_table(per_step, [make_trace(0, records)])
    assert steps["cpu_process_pct"].iloc[0] == pytest.approx(100.0)
    assert steps["rss_bytes"].iloc[0] == 3 * GIB
    assert math.isnan(steps["sm_util_pct"].iloc[0])
    assert math.isnan(steps["peak_reserved_bytes"].iloc[0])
    ranks = per_rank_table(per_step, [make_trace(0, records)])
    assert ranks["peak_rss_bytes"].iloc[0] == 3 * GIB
    assert ranks["cpu_process_pct"].iloc[0] == pytest.approx(100.0)
    assert ranks["slowest"].tolist() == [False]  # one rank is nobody's straggler
    assert pd.isna(steps["slowest_rank"].iloc[0])


def test_two_trace_files_of_one_rank_share_its_records(two_ranks):
    per_step, traces = two_ranks
    doubled = traces + [make_trace(0, traces[0].records)]
    assert per_rank_table(per_step, doubled).equals(per_rank_table(per_step, traces))
    assert len(per_step_table(per_step, doubled)) == 6


def test_without_records_the_resource_columns_are_empty(two_ranks):
    per_step, _ = two_ranks
    table = per_step_table(per_step, [make_trace(0), make_trace(1)])
    assert len(table) == 6
    assert table[["peak_reserved_bytes", "sm_util_pct"]].isna().all().all()
    ranks = per_rank_table(per_step, [])
    assert ranks["mean_step_ns"].tolist() == [100 * MS, pytest.approx(350 / 3 * MS)]
    assert ranks["peak_reserved_bytes"].isna().all()


def test_a_crashed_rank_with_records_but_no_breakdown_still_appears():
    records = RunRecords(comms=pd.DataFrame(), samples=pd.DataFrame(),
                         steps=step_records(3, [{"step": 0, "start_ns": HOST_T0,
                                                 "end_ns": HOST_T0 + MS,
                                                 "cuda_peak_reserved_bytes": GIB}]),
                         manifest=[])
    per_step = pd.DataFrame([breakdown_row(0, 0, 100, 60, 10, 10, 0, 20)])
    table = per_rank_table(per_step, [make_trace(0), make_trace(3, records)])
    assert table["rank"].tolist() == [0, 3]
    assert table["peak_reserved_bytes"].iloc[1] == GIB
    assert table["steps"].iloc[1] == 0 and math.isnan(table["mean_step_ns"].iloc[1])


@pytest.mark.parametrize("per_step", [None, pd.DataFrame(), pd.DataFrame({"rank": []})])
def test_empty_inputs_give_empty_frames_with_columns(per_step):
    steps = per_step_table(per_step, [])
    assert steps.empty and list(steps.columns) == PER_STEP_COLUMNS
    ranks = per_rank_table(per_step, None)
    assert ranks.empty and list(ranks.columns) == PER_RANK_COLUMNS


def test_missing_values_do_not_crash():
    per_step = pd.DataFrame([breakdown_row(0, 0, 100, 60, 10, 10, 0, 20),
                             {"rank": 1, "step": 0, "step_ns": np.nan, "kind": None}])
    records = RunRecords(comms=pd.DataFrame(), samples=pd.DataFrame({"t_ns": [None]}),
                         steps=pd.DataFrame({"step": [0, None]}), manifest=[])
    table = per_step_table(per_step, [make_trace(1, records)])
    assert len(table) == 2
    ranks = per_rank_table(per_step, [make_trace(1, records)])
    assert ranks["rank"].tolist() == [0, 1]
    assert math.isnan(ranks["mean_step_ns"].iloc[1])


def test_each_rank_row_says_how_its_run_ended_and_a_rank_without_steps_keeps_its_row():
    per_step = pd.DataFrame([breakdown_row(0, 0, 100, 60, 10, 10, 0, 20)])
    ok = make_trace(0)
    ok.status = "ok"
    killed = make_trace(1, RunRecords(comms=pd.DataFrame(), samples=pd.DataFrame(),
                                      steps=pd.DataFrame(), manifest=[]))
    killed.status, killed.has_trace = "crashed", False
    unmarked = make_trace(2)  # analysed, but no step of it was: no records either
    table = per_rank_table(per_step, [ok, killed, unmarked])
    assert table["rank"].tolist() == [0, 1, 2]
    assert table["status"].tolist() == ["ok", "crashed", None]
    assert table["steps"].tolist() == [1, 0, 0]
