"""analysis.rank.tables: per-step and per-rank tables with memory, utilisation and rank spread."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.core.frames import empty_events
from analysis.core.model import RankTrace, RunRecords
from analysis.rank.resource_use import rank_resources, step_resources
from analysis.rank.step_breakdown import BREAKDOWN_NS_COLUMNS
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
                     events=empty_events(), steps=steps, records=records, problems=[])


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


# ---- runs without tracer records ----------------------------------------------------------------
def unordered_rows() -> pd.DataFrame:
    """Rows out of (step, rank) order; step 7 has one rank, step 3 two, with a NaN memcpy."""
    frame = pd.DataFrame({"rank": [1, 0, 0, 1], "step": [3, 7, 3, 9]})
    for column in BREAKDOWN_NS_COLUMNS:
        frame[column] = np.zeros(4)
    frame["step_ns"] = [30.0, 10.0, 20.0, np.nan]
    frame["compute_only_ns"] = [5.0, 1.0, 2.0, np.nan]
    frame["overlap_ns"] = [1.0, 1.0, 1.0, np.nan]
    frame["memcpy_ns"] = [np.nan, 1.0, 0.0, np.nan]
    frame["overlap_pct"] = np.nan
    frame["kind"] = ["gpu", "gpu", "gpu", "cpu"]
    frame["start_ns"] = np.arange(4)
    return frame


def test_per_step_spread_order_and_missing_resources():
    table = per_step_table(unordered_rows(), [make_trace(0), make_trace(1)])
    assert list(table.columns) == [*PER_STEP_COLUMNS, "start_ns"]
    assert table["step"].tolist() == [3, 3, 7, 9]
    assert table["rank"].tolist() == [0, 1, 0, 1]
    assert table["start_ns"].tolist() == [2, 0, 1, 3]
    assert table["work_ns"].tolist()[:3] == [3.0, 6.0, 3.0]  # NaN memcpy counts as 0
    assert np.isnan(table["work_ns"].iloc[3])  # all three parts missing
    assert table["ranks_max_step_ns"].tolist()[:3] == [30.0, 30.0, 10.0]
    assert table["ranks_min_step_ns"].tolist()[:3] == [20.0, 20.0, 10.0]
    assert table["ranks_mean_step_ns"].tolist()[:3] == [25.0, 25.0, 10.0]
    assert table["imbalance_pct"].tolist()[:3] == [20.0, 20.0, 0.0]
    assert table["slowest_rank"].tolist()[:2] == [1, 1]
    assert table["slowest_rank"].isna().tolist() == [False, False, True, True]
    assert table[["ranks_max_step_ns", "imbalance_pct"]].iloc[3].isna().all()  # untimed step
    assert str(table["slowest_rank"].dtype) == "Int64"
    assert str(table["util_samples"].dtype) == "Int64" and table["util_samples"].isna().all()
    assert table["peak_allocated_bytes"].dtype == np.float64
    assert table["peak_allocated_bytes"].isna().all()
    assert isinstance(table.index, pd.RangeIndex)


def test_per_step_spread_by_hand():
    frame = pd.DataFrame({
        "rank": pd.array([0, 1, 2, 0, 1, 0, 1, 0], dtype="Int64"),
        "step": pd.array([2, 2, 2, 1, 1, 3, 3, 4], dtype="Int64"),
        # step 2: ranks 0 and 2 tie for the slowest (the first is named); step 1: rank 1's
        # NaN leaves rank 0 alone (no slowest); step 3: mean 0; step 4: one rank.
        "step_ns": [10.0, 4.0, 10.0, 6.0, np.nan, 0.0, 0.0, 5.0],
    })
    table = per_step_table(frame, [])
    assert table[["step", "rank"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1], [2, 2],
                                                       [3, 0], [3, 1], [4, 0]]
    assert table["ranks_max_step_ns"].tolist() == [6.0, 6.0, 10.0, 10.0, 10.0, 0.0, 0.0, 5.0]
    assert table["ranks_min_step_ns"].tolist() == [6.0, 6.0, 4.0, 4.0, 4.0, 0.0, 0.0, 5.0]
    assert table["ranks_mean_step_ns"].tolist() == [6.0, 6.0, 8.0, 8.0, 8.0, 0.0, 0.0, 5.0]
    slowest = table["slowest_rank"].tolist()
    assert slowest[0] is pd.NA and slowest[1] is pd.NA and slowest[7] is pd.NA
    assert slowest[2:7] == [0, 0, 0, 0, 0]
    imbalance = table["imbalance_pct"].tolist()
    assert imbalance[:5] == [0.0, 0.0, 25.0, 25.0, 25.0] and imbalance[7] == 0.0
    assert math.isnan(imbalance[5]) and math.isnan(imbalance[6])


def test_per_step_spread_of_a_row_without_step():
    frame = pd.DataFrame({"rank": pd.array([0], dtype="Int64"),
                          "step": pd.array([None], dtype="Int64"), "step_ns": [1.0]})
    table = per_step_table(frame, [])
    assert table["step"].isna().all() and table["slowest_rank"].isna().all()
    assert table[["ranks_max_step_ns", "ranks_min_step_ns", "ranks_mean_step_ns",
                  "imbalance_pct"]].isna().all().all()


def test_per_rank_rows_without_resources():
    table = per_rank_table(unordered_rows(), [make_trace(1), make_trace(0)])
    assert list(table.columns) == PER_RANK_COLUMNS
    assert table["rank"].tolist() == [0, 1]
    assert table["steps"].tolist() == [2, 2]
    assert table["mean_step_ns"].tolist() == [15.0, 30.0]
    assert table["work_ns"].tolist() == [3.0, 6.0]
    assert table["slowdown_vs_fastest_pct"].tolist() == [0.0, 100.0]
    assert table["slowest"].tolist() == [False, True]
    assert table["peak_reserved_pct"].isna().all() and table["peak_rss_bytes"].isna().all()
    assert table["kind"].tolist() == ["gpu", "cpu"]  # a tie: the smallest of the kinds


def test_listed_rank_without_steps_still_gets_its_row():
    table = per_rank_table(unordered_rows(), [make_trace(0), make_trace(1), make_trace(2)])
    assert table["rank"].tolist() == [0, 1, 2]
    assert table["steps"].tolist() == [2, 2, 0]
    assert np.isnan(table["mean_step_ns"].iloc[2])


def test_without_records_the_resources_are_empty_typed_frames():
    resources = rank_resources([make_trace(0), make_trace(1)])
    assert resources.empty and isinstance(resources.index, pd.RangeIndex)
    assert str(resources["rank"].dtype) == "Int64"
    assert all(resources[c].dtype == np.float64 for c in resources.columns[1:])
    steps = step_resources([make_trace(0), make_trace(1)])
    assert steps.empty and [str(d) for d in steps.dtypes[:2]] == ["Int64", "Int64"]


def breakdown_of(rank, steps, step_ms, compute_ms) -> pd.DataFrame:
    """breakdown_per_step's frame (int64 times, str kind) for one rank."""
    n = len(steps)
    columns = {"rank": rank, "step": np.array(steps, dtype=np.int64),
               "step_ns": np.array(step_ms, dtype=np.int64) * MS,
               "compute_only_ns": np.array(compute_ms, dtype=np.int64) * MS}
    for name in BREAKDOWN_NS_COLUMNS[2:]:
        columns[name] = np.zeros(n, dtype=np.int64)
    columns["idle_ns"] = columns["step_ns"] - columns["compute_only_ns"]
    columns.update(overlap_pct=np.full(n, np.nan), kind="gpu",
                   start_ns=np.arange(n, dtype=np.int64), end_ns=np.arange(n, dtype=np.int64) + 1)
    return pd.DataFrame(columns)


def two_rank_breakdown() -> pd.DataFrame:
    return pd.concat([breakdown_of(0, [1, 2], [10, 30], [4, 6]),
                      breakdown_of(1, [1, 2], [20, 40], [8, 2])], ignore_index=True)


def test_tables_of_a_run_without_records_by_hand():
    traces = [make_trace(0), make_trace(1)]
    per_rank = per_rank_table(two_rank_breakdown(), traces)
    assert per_rank["rank"].tolist() == [0, 1]
    assert per_rank["mean_step_ns"].tolist() == [20e6, 30e6]
    assert per_rank["compute_only_ns"].tolist() == [5e6, 5e6]
    assert per_rank["idle_pct"].tolist() == [30 / 40 * 100, 50 / 60 * 100]
    assert per_rank["slowdown_vs_fastest_pct"].tolist() == [0.0, 50.0]
    assert per_rank["slowest"].tolist() == [False, True]
    assert per_rank["peak_rss_bytes"].isna().all() and per_rank["steps"].tolist() == [2, 2]
    per_step = per_step_table(two_rank_breakdown(), traces)
    assert per_step[["step", "rank"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
    assert per_step["ranks_mean_step_ns"].tolist() == [15e6, 15e6, 35e6, 35e6]
    assert per_step["slowest_rank"].tolist() == [1, 1, 1, 1]
    assert per_step["imbalance_pct"].tolist() == [5 / 15 * 100] * 2 + [5 / 35 * 100] * 2
    assert per_step["peak_allocated_bytes"].isna().all()
    assert per_step["util_samples"].isna().all() and str(per_step["util_samples"].dtype) == "Int64"


def test_per_step_table_types_its_columns_and_leaves_the_input_alone():
    frame = two_rank_breakdown()
    table = per_step_table(frame, [make_trace(0), make_trace(1)])
    assert str(table["rank"].dtype) == "Int64" and str(table["step"].dtype) == "Int64"
    assert table["step_ns"].dtype == np.float64 and table["start_ns"].dtype == np.int64
    assert list(table.columns[len(PER_STEP_COLUMNS):]) == ["start_ns", "end_ns"]
    assert table["step_ns"].tolist() == [10e6, 20e6, 30e6, 40e6]  # by step, then rank
    assert table["idle_ns"].tolist() == [6e6, 12e6, 24e6, 38e6]
    table.loc[0, "step_ns"] = -1.0
    assert frame["step_ns"].iloc[0] == 10 * MS  # the table shares no memory with its input


def test_a_row_without_rank_comes_last_in_its_step_and_in_no_spread_or_rank_row():
    frame = two_rank_breakdown().astype({"rank": object})
    frame.loc[0, "rank"] = None  # rank 0's step 1 (10 ms) loses its rank
    table = per_step_table(frame, [make_trace(0), make_trace(1)])
    assert table["step"].tolist() == [1, 1, 2, 2]
    assert table["rank"].isna().tolist() == [False, True, False, False]
    assert table["step_ns"].tolist() == [20e6, 10e6, 30e6, 40e6]
    # Step 1's spread is rank 1's alone: no slowest rank of one.
    assert table["ranks_mean_step_ns"].tolist() == [20e6, 20e6, 35e6, 35e6]
    assert table["slowest_rank"].isna().tolist() == [True, True, False, False]
    per_rank = per_rank_table(frame, [make_trace(0), make_trace(1)])
    assert per_rank["steps"].tolist() == [1, 2]
    assert per_rank["mean_step_ns"].tolist() == [30e6, 30e6]


PER_RANK_STEPS = pd.DataFrame(
    # rank, step, step_ns, compute_only, comm_only, overlap, memcpy, idle, exposed_comm, kind
    [(0, 1, 100, 40, 10, 20, 0, 30, 10, "gpu"),
     (1, 1, 200, 100, 0, 0, None, 100, 0, "gpu"),
     (0, 2, 300, 100, 50, 60, 10, 80, 50, "cpu"),
     (1, 2, None, 50, 0, 0, 0, 60, 0, "cpu"),
     (2, 1, 500, 500, 0, 0, 0, 0, 0, None),
     (None, 1, 900, 900, 0, 0, 0, 0, 0, "gpu"),  # no rank: in no rank's row
     (1, 3, 400, 150, 0, 0, 30, 200, 0, "gpu")],
    columns=["rank", "step", "step_ns", "compute_only_ns", "comm_only_ns", "overlap_ns",
             "memcpy_ns", "idle_ns", "exposed_comm_ns", "kind"]).assign(overlap_pct=np.nan)

# By hand. Rank 0: gpu and cpu once each, the tie goes to the smaller, "cpu"; step_ns 100, 300;
# work = compute_only + overlap + memcpy = 60, 170; idle 110 and exposed 60 of 400 ns.
# Rank 1: gpu twice; step_ns 200, -, 400; memcpy -, 0, 30 (mean of the known); work 100, 50,
# 180; idle 360 and exposed 0 of 600 ns. Rank 2: no kind known. Fastest mean: rank 0's 200.
PER_RANK_EXPECTED = {
    "rank": [0, 1, 2], "kind": ["cpu", "gpu", None], "steps": [2, 3, 1],
    "mean_step_ns": [200.0, 300.0, 500.0], "median_step_ns": [200.0, 300.0, 500.0],
    "min_step_ns": [100.0, 200.0, 500.0], "max_step_ns": [300.0, 400.0, 500.0],
    "compute_only_ns": [70.0, 100.0, 500.0], "comm_only_ns": [30.0, 0.0, 0.0],
    "overlap_ns": [40.0, 0.0, 0.0], "memcpy_ns": [5.0, 15.0, 0.0],
    "idle_ns": [55.0, 120.0, 0.0], "exposed_comm_ns": [30.0, 0.0, 0.0],
    "work_ns": [115.0, 110.0, 500.0], "idle_pct": [27.5, 60.0, 0.0],
    "exposed_comm_pct": [15.0, 0.0, 0.0], "slowdown_vs_fastest_pct": [0.0, 50.0, 150.0],
    "slowest": [False, False, True],
}


def test_per_rank_table_statistics_and_kind_tie_by_hand():
    table = per_rank_table(PER_RANK_STEPS, None)
    for column, values in PER_RANK_EXPECTED.items():
        if column == "kind":
            assert [None if pd.isna(k) else k for k in table[column]] == values
        else:
            assert table[column].tolist() == pytest.approx(values, rel=1e-12), column
