"""The breakdown's definitions (docs/definitions.md) on synthetic traces with hand-computed answers.

Times in the builders are microseconds; the breakdown reports nanoseconds, hence the * US.
"""

import numpy as np
import pandas as pd
import pytest

from analysis.core import intervals
from analysis.core.steps import WHOLE_TRACE_STEP
from analysis.rank import step_breakdown as breakdown
from analysis.rank.hta import hta_is_compute, hta_temporal_breakdown
from analysis.rank.idle import idle_gaps, idle_summary
from analysis.rank.layers import PARTS, asynchronous_comm, training_threads
from analysis.run.loading import load_run_path
from helpers.launch import REPO
from helpers.synthetic import TraceBuilder, trace_name

US = 1000


def load_one(builder: TraceBuilder, tmp_path, name: str = "t"):
    builder.write(tmp_path / name / trace_name(builder.rank if builder.rank is not None else 0))
    result = load_run_path(tmp_path / name, use_cache=False)
    assert len(result.ranks) == 1
    return result.ranks[0], result


def parts(row) -> dict:
    return {k: int(row[k]) // US for k in ["step_ns", *PARTS, "exposed_comm_ns"]}


def check_sums(per_step: pd.DataFrame):
    assert (per_step[PARTS].sum(axis=1) == per_step["step_ns"]).all()


# ---- intervals --------------------------------------------------------------------------------
def test_union_joins_overlapping_and_touching_intervals_and_drops_empty_ones():
    starts, ends = intervals.union([5, 0, 20, 10, 30], [12, 5, 25, 11, 30])
    assert starts.tolist() == [0, 20] and ends.tolist() == [12, 25]


def test_gaps_are_the_uncovered_parts_of_the_window():
    starts, ends = intervals.gaps([10, 40], [20, 60], 0, 50)
    assert list(zip(starts.tolist(), ends.tolist())) == [(0, 10), (20, 40)]


def test_state_durations_split_windows_by_active_layers():
    a = (np.array([0, 10]), np.array([20, 15]))  # self-overlapping layer
    b = (np.array([15]), np.array([30]))
    result = intervals.state_durations([a, b], np.array([0, 18]), np.array([40, 25]))
    # window [0,40): a only 0-15, both 15-20, b only 20-30, none 30-40
    assert result[0].tolist() == [10, 15, 10, 5]
    # window [18,25): both 18-20, b only 20-25
    assert result[1].tolist() == [0, 0, 5, 2]


def test_state_durations_match_brute_force_on_random_layers():
    rng = np.random.default_rng(7)
    for _ in range(50):
        layers = []
        for _ in range(3):
            starts = rng.integers(0, 60, 5)
            layers.append((starts, starts + rng.integers(-3, 20, 5)))
        w_start, w_end = np.array([0, 25]), np.array([70, 40])
        got = intervals.state_durations(layers, w_start, w_end)
        for w in range(2):
            expected = np.zeros(8, dtype=int)
            for t in range(w_start[w], w_end[w]):
                state = sum(1 << b for b, (s, e) in enumerate(layers) if ((s <= t) & (t < e)).any())
                expected[state] += 1
            assert got[w].tolist() == expected.tolist()


def test_hta_merge_keeps_negative_intervals_as_hta_does():
    # (11, 10) is what HTA makes of a 0.3 us kernel at 10.4 us; it counts -1 there.
    busy, first, last = intervals.hta_merged(np.array([11.0, 21.0]), np.array([10.0, 30.0]))
    assert (busy, first, last) == (8.0, 11.0, 30.0)


# ---- GPU breakdown ----------------------------------------------------------------------------
def test_compute_overlapping_communication(tmp_path):
    b = TraceBuilder().step(1, 0, 100).compute(10, 50).nccl(30, 70)
    trace, _ = load_one(b, tmp_path)
    row = breakdown.breakdown_per_step(trace).iloc[0]
    assert parts(row) == {"step_ns": 100, "compute_only_ns": 20, "comm_only_ns": 20,
                          "overlap_ns": 20, "memcpy_ns": 0, "idle_ns": 40, "exposed_comm_ns": 20}
    assert row["overlap_pct"] == 50.0 and row["kind"] == "gpu" and row["step"] == 1


def test_union_across_streams_with_gaps(tmp_path):
    b = (TraceBuilder().step(1, 0, 50)
         .compute(0, 10, stream=7).compute(5, 20, stream=8).compute(30, 40, stream=7))
    trace, _ = load_one(b, tmp_path)
    row = breakdown.breakdown_per_step(trace).iloc[0]
    assert parts(row)["compute_only_ns"] == 30 and parts(row)["idle_ns"] == 20
    assert np.isnan(row["overlap_pct"])  # no communication at all


def test_memcpy_counts_only_where_no_kernel_runs(tmp_path):
    b = (TraceBuilder().step(1, 0, 50)
         .memcpy(10, 20, stream=9).memset(15, 30, stream=10).compute(25, 40, stream=7))
    trace, _ = load_one(b, tmp_path)
    assert parts(breakdown.breakdown_per_step(trace).iloc[0]) == {
        "step_ns": 50, "compute_only_ns": 15, "comm_only_ns": 0, "overlap_ns": 0,
        "memcpy_ns": 15, "idle_ns": 20, "exposed_comm_ns": 0}


def test_communication_on_one_stream_hidden_by_compute_on_another(tmp_path):
    b = TraceBuilder().step(1, 0, 40).nccl(10, 30, stream=20).compute(5, 35, stream=7)
    trace, _ = load_one(b, tmp_path)
    row = breakdown.breakdown_per_step(trace).iloc[0]
    assert parts(row)["overlap_ns"] == 20 and parts(row)["exposed_comm_ns"] == 0
    assert parts(row)["compute_only_ns"] == 10 and row["overlap_pct"] == 100.0


def test_device_work_is_split_at_step_boundaries(tmp_path):
    b = TraceBuilder().step(1, 0, 100).step(2, 100, 200).compute(90, 130)
    trace, _ = load_one(b, tmp_path)
    per_step = breakdown.breakdown_per_step(trace)
    assert per_step["step"].tolist() == [1, 2]
    assert (per_step["compute_only_ns"] // US).tolist() == [10, 30]
    assert (per_step["idle_ns"] // US).tolist() == [90, 70]
    check_sums(per_step)


def test_nanosecond_float_timestamps_are_exact(tmp_path):
    base = 1712195495502094.5  # float64 steps by 0.25 us here
    b = (TraceBuilder().step(1, base, base + 50.0)
         .compute(base + 10.25, base + 10.75).nccl(base + 10.5, base + 20.0))
    trace, _ = load_one(b, tmp_path)
    assert trace.float_timestamps
    assert int(trace.steps["start_ns"].iloc[0]) == 1712195495502094500
    row = breakdown.breakdown_per_step(trace).iloc[0]
    assert (row["compute_only_ns"], row["overlap_ns"], row["comm_only_ns"]) == (250, 250, 9250)
    assert row["idle_ns"] == 50000 - 9750


def test_trace_without_profiler_steps_is_one_window_over_its_span(tmp_path):
    b = TraceBuilder().compute(10, 20).compute(40, 60).op("aten::mm", 5, 8)
    trace, result = load_one(b, tmp_path)
    per_step = breakdown.breakdown_per_step(trace)
    assert per_step["step"].tolist() == [WHOLE_TRACE_STEP]
    # span: the earliest event (the op at 5) to the latest end (60)
    assert parts(per_step.iloc[0])["step_ns"] == 55
    assert parts(per_step.iloc[0])["compute_only_ns"] == 30
    assert any("no ProfilerStep" in p and "whole trace span" in p for p in result.problems)


# ---- CPU breakdown ----------------------------------------------------------------------------
def cpu_trace() -> TraceBuilder:
    b = TraceBuilder(backend="gloo").step(1, 0, 100)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10, 60)
    b.op("aten::mm", 20, 30)  # nested: adds nothing
    b.op("c10d::allreduce_", 40, 50)  # nested comm: the training thread communicates here
    b.op("aten::add_", 70, 90)
    b.annotation("gloo:all_reduce", 45, 80, tid=2)  # gloo's own thread
    b.op("aten::copy_", 0, 100, tid=3)  # a thread outside the training loop is not compute
    return b


def test_cpu_breakdown_with_nested_ops_and_comm_on_another_thread(tmp_path):
    trace, _ = load_one(cpu_trace(), tmp_path)
    row = breakdown.breakdown_per_step(trace).iloc[0]
    # 0-10 idle, 10-40 compute, 40-50 comm (c10d op), 50-60 both, 60-70 gloo only,
    # 70-80 both, 80-90 compute, 90-100 idle
    assert parts(row) == {"step_ns": 100, "compute_only_ns": 40, "comm_only_ns": 20,
                          "overlap_ns": 20, "memcpy_ns": 0, "idle_ns": 20, "exposed_comm_ns": 20}
    assert row["kind"] == "cpu" and row["overlap_pct"] == 50.0


def async_send_step() -> TraceBuilder:
    """A 13.2 ms step: an isend whose gloo:send stays open 12 ms, until wait(), over 1.84 ms
    of the thread's own ops (as torch records isend on gloo)."""
    b = TraceBuilder(backend="gloo").step(1, 0, 13200)
    b.op("c10d::send", 100, 140)
    b.annotation("gloo:send", 120, 12120)  # starts inside c10d::send, ends at wait()
    for start in (200, 700, 1200, 1700):
        b.op("aten::addmm", start, start + 400)
        b.op("aten::copy_", start + 10, start + 100)  # nested: adds nothing
    b.op("aten::addmm", 12500, 12740)
    b.op("c10d::allreduce_", 12800, 13000)  # blocking: hides nothing of the above
    b.annotation("gloo:all_reduce", 12850, 13000, tid=2)
    return b


def test_an_asynchronous_send_does_not_hide_the_compute_that_runs_meanwhile(tmp_path):
    trace, _ = load_one(async_send_step(), tmp_path)
    row = breakdown.breakdown_per_step(trace).iloc[0]
    assert row["compute_only_ns"] + row["overlap_ns"] == 1840 * US
    # comm 100-12120 with 1600 us of ops under it, and the all-reduce 12800-13000;
    # idle 0-100, 12120-12500, 12740-12800, 13000-13200
    assert parts(row) == {"step_ns": 13200, "compute_only_ns": 240, "comm_only_ns": 10620,
                          "overlap_ns": 1600, "memcpy_ns": 0, "idle_ns": 740,
                          "exposed_comm_ns": 10620}
    events = trace.events
    asynchronous = asynchronous_comm(events, training_threads(events))
    assert events.loc[asynchronous, "name"].tolist() == ["gloo:send"]


def test_training_threads_are_the_ones_with_profiler_steps(tmp_path):
    trace, _ = load_one(cpu_trace(), tmp_path)
    assert training_threads(trace.events) == {("100", "1")}


# ---- idle gaps ----------------------------------------------------------------------------------
def test_idle_gaps_are_classified_by_host_activity(tmp_path):
    b = TraceBuilder().step(1, 0, 150)
    b.compute(0, 10, launch_at=0)
    b.compute(20, 30, launch_at=1)  # gap 10-20: its next kernel was queued already: other
    b.op("aten::linear", 29, 39)
    b.compute(40, 50, launch_at=32)  # gap 30-40: launched late, host busy in ops: launch bound
    b.op("cudaDeviceSynchronize", 50, 58, cat="cuda_runtime")
    b.compute(60, 70, launch_at=58)  # gap 50-60: host in a synchronize most of it
    b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 70, 110)
    b.compute(95, 100, launch_at=93)  # gap 70-95: loading data
    b.compute(105, 120, launch_at=3)  # gap 100-105: queued work, though the host loads data
    b.compute(140, 150, launch_at=139)  # gap 120-140: launched late, host in no op: other
    trace, _ = load_one(b, tmp_path)
    gaps = idle_gaps(trace)
    assert list(zip(gaps["start_ns"] // US, gaps["end_ns"] // US, gaps["host_activity"])) == [
        (10, 20, "other"), (30, 40, "launch_bound"), (50, 60, "synchronisation"),
        (70, 95, "data_loading"), (100, 105, "other"), (120, 140, "other")]
    assert gaps["dur_ns"].sum() == breakdown.breakdown_per_step(trace)["idle_ns"].sum()
    summary = idle_summary(gaps).set_index("host_activity")
    assert summary.loc["data_loading", "total_ns"] == 25 * US
    assert summary.loc["other", "gaps"] == 3 and summary.loc["other", "total_ns"] == 35 * US


def test_cpu_idle_gaps_in_data_loading(tmp_path):
    b = TraceBuilder(backend="gloo").step(1, 0, 100)
    b.op("aten::mm", 0, 20)
    b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 20, 40)
    b.op("aten::randn", 25, 30)  # an op inside data loading is compute
    b.op("aten::mm", 60, 100)
    trace, _ = load_one(b, tmp_path)
    gaps = idle_gaps(trace)
    # a gap is data loading when at least half of it is: 20-25 all of it, 30-60 only a third
    assert list(zip(gaps["start_ns"] // US, gaps["end_ns"] // US, gaps["host_activity"])) == [
        (20, 25, "data_loading"), (30, 60, "other")]


def test_rank_totals_sum_steps_and_recompute_overlap_share(tmp_path):
    b = (TraceBuilder().step(1, 0, 100).step(2, 100, 200)
         .compute(10, 50).nccl(30, 70)  # step 1: overlap 20, comm only 20
         .nccl(110, 150))  # step 2: comm only 40
    trace, _ = load_one(b, tmp_path)
    totals = breakdown.rank_totals(breakdown.breakdown_per_step(trace)).iloc[0]
    assert totals["steps"] == 2 and totals["step_ns"] == 200 * US
    assert totals["comm_only_ns"] == 60 * US and totals["overlap_ns"] == 20 * US
    assert totals["overlap_pct"] == 25.0


def _totals_input(ranks, kinds, rank_dtype="int64", kind_dtype=object) -> pd.DataFrame:
    """breakdown_per_step rows: row i (from 1) has i * 10**k ns in the k-th time column."""
    rows = len(ranks)
    frame = pd.DataFrame({"rank": pd.Series(ranks, dtype=rank_dtype), "step": np.arange(rows)})
    for offset, column in enumerate(breakdown.BREAKDOWN_NS_COLUMNS):
        frame[column] = (np.arange(rows, dtype=np.int64) + 1) * 10 ** offset
    frame["overlap_pct"] = 0.0
    frame["kind"] = pd.Series(kinds, dtype=kind_dtype)
    frame["start_ns"] = 0
    frame["end_ns"] = 1
    return frame


def test_rank_totals_in_order_of_first_appearance_with_their_sums():
    totals = breakdown.rank_totals(_totals_input([3, 1, 3, 2, 1],
                                                 ["gpu", "cpu", "cpu", "gpu", "gpu"]))
    assert list(totals.columns) == breakdown.TOTALS_COLUMNS
    assert totals["rank"].tolist() == [3, 1, 2]
    assert totals["steps"].tolist() == [2, 2, 1]
    # rows (1-based) of rank 3: 1 and 3; of rank 1: 2 and 5; of rank 2: 4
    assert totals["step_ns"].tolist() == [4, 7, 4]
    assert totals["compute_only_ns"].tolist() == [40, 70, 40]
    assert totals["kind"].tolist() == ["gpu", "cpu", "gpu"]  # each rank's first
    # comm_only 100 * n and overlap 1000 * n: 1000 / 1100 of the communication is hidden
    assert totals["overlap_pct"].tolist() == [100.0 * 1000 / 1100] * 3
    assert [str(d) for d in totals.dtypes[:-1]] == ["int64"] * 9 + ["float64"]
    assert isinstance(totals.index, pd.RangeIndex) and totals.index.tolist() == [0, 1, 2]


def test_rank_totals_kind_keeps_its_dtype_and_a_missing_kind_reads_the_first_present():
    totals = breakdown.rank_totals(_totals_input([0, 0], ["gpu", "gpu"], kind_dtype="str"))
    assert totals["kind"].dtype == pd.Series(["gpu"], dtype="str").dtype
    totals = breakdown.rank_totals(_totals_input([5, 5, 6, 7], [None, "cpu", "gpu", None]))
    assert totals["kind"].tolist()[:2] == ["cpu", "gpu"] and pd.isna(totals["kind"].iloc[2])
    assert totals["steps"].tolist() == [2, 1, 1]


def test_rank_totals_rows_without_a_rank_are_summed_as_one():
    totals = breakdown.rank_totals(_totals_input([0, None, 1, None], ["gpu"] * 4,
                                                 rank_dtype=object))
    assert totals["rank"].tolist() == [0, None, 1]
    assert totals["steps"].tolist() == [1, 2, 1]
    assert totals["step_ns"].tolist() == [1, 2 + 4, 3]


def test_rank_totals_of_no_step_is_an_empty_frame():
    totals = breakdown.rank_totals(breakdown.empty_breakdown())
    assert totals.empty and set(totals.columns) == set(breakdown.TOTALS_COLUMNS)


def test_shared_layers_give_the_tables_computed_alone():
    from types import SimpleNamespace

    events = pd.DataFrame({
        "name": pd.Categorical(["k1", "nccl", "k2"]), "cat": pd.Categorical(["kernel"] * 3),
        "ts_ns": np.array([0, 5, 30], dtype=np.int64), "end_ns": np.array([10, 20, 40]),
        "dur_ns": np.array([10, 15, 10]), "is_gpu": [True] * 3, "is_comm": [False, True, False],
        "pid": pd.Categorical(["1"] * 3), "tid": pd.Categorical(["7"] * 3),
        "correlation": np.array([-1, -1, -1]), "stream": np.array([7, 7, 7])})
    steps = pd.DataFrame({"step": [WHOLE_TRACE_STEP], "start_ns": [0], "end_ns": [40]})
    trace = SimpleNamespace(events=events, steps=steps, all_steps=None, rank=0)
    shared = breakdown.kind_and_layers(trace)
    per_step = breakdown.breakdown_per_step(trace, shared)
    pd.testing.assert_frame_equal(per_step, breakdown.breakdown_per_step(trace), check_exact=True)
    # compute 0-5 alone, overlap 5-10, comm 10-20 alone, idle 20-30, compute 30-40
    assert per_step[["compute_only_ns", "overlap_ns", "comm_only_ns", "idle_ns"]].values.tolist() \
        == [[15, 5, 10, 10]]
    gaps = idle_gaps(trace, shared)
    pd.testing.assert_frame_equal(gaps, idle_gaps(trace), check_exact=True)
    assert gaps[["start_ns", "end_ns"]].values.tolist() == [[20, 30]]


# ---- HTA-compatible columns (answers checked against HTA 0.5.0 itself) ---------------------------
def hta(builders, tmp_path, name="h"):
    for builder in builders:
        builder.write(tmp_path / name / trace_name(builder.rank))
    result = load_run_path(tmp_path / name, use_cache=False)
    return hta_temporal_breakdown(result.ranks).set_index("rank")


HTA_VALUES = ["idle_us", "compute_us", "non_compute_us", "kernel_time_us"]


def test_hta_window_drops_work_launched_in_the_last_step(tmp_path):
    b = TraceBuilder().step(1, 0, 100).step(2, 100, 200).step(3, 200, 300)
    b.compute(10, 30, launch_at=5).nccl(20, 50, launch_at=15).memcpy(60, 70, launch_at=55)
    b.compute(110, 140, launch_at=105).compute(130, 150, stream=8, launch_at=106)
    b.kernel("batch_norm_SyncBN_kernel", 160, 170, launch_at=150)  # "Sync": non-compute to HTA
    b.compute(190, 220, launch_at=180)  # launched in step 2, runs into step 3: kept
    b.compute(210, 260, launch_at=205)  # launched in the last step: dropped
    b.compute(270, 280, launch_at=200)  # launched as the last step starts: dropped too
    row = hta([b], tmp_path).loc[0]
    # kernels busy [10,50) [60,70) [110,150) [160,170) [190,220) = 130 of 210
    assert row[HTA_VALUES].tolist() == [80.0, 90.0, 40.0, 210.0]


def test_hta_rounds_float_timestamps_like_hta(tmp_path):
    # ceil(10.4)=11, floor(10.7)=10: HTA's kernel of -1 us; 20.2-30.9 becomes 21-30.
    b = TraceBuilder().step(1, 0.0, 50.0).compute(10.4, 10.7).compute(20.2, 30.9)
    assert hta([b], tmp_path).loc[0][HTA_VALUES].tolist() == [11.0, 8.0, 0.0, 19.0]


def test_hta_step_names_are_counted_across_the_runs_ranks(tmp_path):
    def rank(r, step):
        return (TraceBuilder(rank=r, world_size=2).step(step, 50, 100)
                .compute(20, 30, launch_at=10).compute(70, 90, launch_at=60))

    # Two distinct ProfilerStep names in the run: each rank drops its last (only) step.
    both = hta([rank(0, 1), rank(1, 2)], tmp_path, "both")
    assert both[HTA_VALUES].values.tolist() == [[0.0, 10.0, 0.0, 10.0]] * 2
    # One name only: HTA filters nothing.
    alone = hta([rank(0, 1)], tmp_path, "alone")
    assert alone.loc[0][HTA_VALUES].tolist() == [40.0, 30.0, 0.0, 70.0]


def test_hta_columns_are_nan_with_a_note_where_hta_fails(tmp_path):
    with_steps = (TraceBuilder(rank=0, world_size=2).step(1, 0, 50).step(2, 50, 100)
                  .compute(10, 20, launch_at=5).compute(60, 70, launch_at=55))
    without_steps = TraceBuilder(rank=1, world_size=2).compute(10, 20, launch_at=5)
    cpu_only = TraceBuilder(rank=0).step(1, 0, 10).op("aten::mm", 1, 2)
    table = hta([with_steps, without_steps], tmp_path, "mixed")
    assert table.loc[0][HTA_VALUES].tolist() == [0.0, 10.0, 0.0, 10.0]
    assert table.loc[1][HTA_VALUES].isna().all() and "no ProfilerStep" in table.loc[1, "note"]
    cpu = hta([cpu_only], tmp_path, "cpu")
    assert cpu.loc[0][HTA_VALUES].isna().all() and "no GPU kernels" in cpu.loc[0, "note"]


@pytest.mark.parametrize("name, compute", [
    ("volta_sgemm_128x64_nn", True),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", False),
    ("Memcpy DtoD (Device -> Device)", False),
    ("Memset (Device)", False),
    ("dma_copy", False),
    ("at::native::SyncBatchNormKernel", False),
    ("void copyMemcpyish", False),
])
def test_hta_kernel_classes(name, compute):
    assert hta_is_compute(name) is compute


def test_the_command_line_entry_imports_without_pandas():
    # `python -m analysis.breakdown` imports analysis and analysis.breakdown before main() runs:
    # neither may import pandas (docs/benchmarks.md, import time).
    import subprocess
    import sys

    probe = "import sys, analysis.breakdown; print('pandas' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "False"
