"""Run comparison (analysis.diff_*) on hand-built frames with exact answers, and a seeded
bootstrap."""

import numpy as np
import pandas as pd
import pytest

from analysis import diff
from analysis.diff import compare as diff_compare
from analysis.diff import operators as diff_ops
from analysis.diff import stats as diff_stats
from analysis.diff import writers as diff_output
from analysis.diff.compare import EVERY_RANK
from helpers.comm_events import events_frame, steps_frame


def _steps(values_by_rank: dict, run: int = 0) -> pd.DataFrame:
    rows = [{"run": run, "rank": rank, "step": step + 1, "step_ns": int(ms * 1e6)}
            for rank, values in values_by_rank.items() for step, ms in enumerate(values)]
    return pd.DataFrame(rows)


# ---- verdict -----------------------------------------------------------------------------------
def test_a_constant_change_has_a_point_interval():
    a = _steps({0: [10] * 6, 1: [10] * 6})
    b = _steps({0: [12] * 6, 1: [12] * 6})
    change = diff_stats.bootstrap_change(a, b, seed=3, resamples=200)
    assert change["change_pct"] == pytest.approx(20.0)
    assert change["ci_low_pct"] == pytest.approx(20.0)
    assert change["ci_high_pct"] == pytest.approx(20.0)
    assert change["significant"] and (change["steps_a"], change["steps_b"]) == (6, 6)
    text = diff_stats.verdict_text(change)
    assert text.startswith("B's step time is 20.0% higher (median 10.0 \u2192 12.0 ms")
    assert "beyond the 10.0% run-to-run noise floor" in text
    assert "in blocks of 2 steps, seed 3" in text


def test_a_run_against_itself_is_no_significant_change():
    a = _steps({0: [10, 11, 9, 14, 10, 12], 1: [10, 12, 9, 13, 11, 12]})
    change = diff_stats.bootstrap_change(a, a.copy(), seed=0, resamples=500)
    assert change["change_pct"] == 0
    assert change["ci_low_pct"] < 0 < change["ci_high_pct"]
    assert diff_stats.verdict_text(change).startswith("no significant change")


def test_the_bootstrap_is_reproducible_from_its_seed_and_draws_blocks_of_steps():
    a = _steps({0: [10, 20, 30, 40]})
    b = _steps({0: [10, 20, 40, 50]})
    first = diff_stats.bootstrap_change(a, b, seed=7, resamples=300)
    again = diff_stats.bootstrap_change(a, b, seed=7, resamples=300)
    assert (first["ci_low_pct"], first["ci_high_pct"]) == (again["ci_low_pct"],
                                                           again["ci_high_pct"])
    # The same draws by hand: per resample, two blocks of two consecutive steps of A (circular:
    # a block from step 4 goes on with step 1), then two of B.
    assert first["block_steps"] == diff_stats.block_length(4) == 2
    rng = np.random.default_rng(7)
    a_ms, b_ms = np.array([10, 20, 30, 40.0]), np.array([10, 20, 40, 50.0])
    changes = []
    for _ in range(300):
        rows_a = (rng.integers(0, 4, 2)[:, None] + np.arange(2)).ravel() % 4
        rows_b = (rng.integers(0, 4, 2)[:, None] + np.arange(2)).ravel() % 4
        changes.append((np.median(b_ms[rows_b]) / np.median(a_ms[rows_a]) - 1) * 100)
    low, high = np.percentile(changes, [2.5, 97.5])
    assert first["ci_low_pct"] == pytest.approx(low)
    assert first["ci_high_pct"] == pytest.approx(high)
    assert first["change_pct"] == pytest.approx((30 / 25 - 1) * 100)


def test_block_length_grows_as_the_cube_root_of_the_steps():
    assert [diff_stats.block_length(n) for n in (1, 3, 4, 11, 27, 64, 1000)] == [1, 1, 2, 2, 3,
                                                                                 4, 10]


def test_consecutive_steps_are_resampled_together():
    # Slow and fast steps alternate: every block of two consecutive steps (8 steps, blocks of
    # 2, wrapping) holds one of each, so every resample has the same median and a run against
    # itself a point interval at 0. Single steps drawn alone would give medians of 10 or 30.
    a = _steps({0: [10, 30] * 4})
    change = diff_stats.bootstrap_change(a, a.copy(), seed=2, resamples=300)
    assert change["block_steps"] == 2
    assert change["ci_low_pct"] == change["ci_high_pct"] == 0


def test_ranks_of_one_step_are_resampled_together():
    # Ranks 0 and 1 take 10 and 30 ms in every step: any resample of steps keeps both, so the
    # pooled median is always 20 and the change exactly 0; resampling (rank, step) rows alone
    # would not.
    a = _steps({0: [10] * 5, 1: [30] * 5})
    change = diff_stats.bootstrap_change(a, a.copy(), seed=1, resamples=300)
    assert change["ci_low_pct"] == change["ci_high_pct"] == 0


def test_repeated_runs_put_run_to_run_noise_in_the_interval():
    # Each side: two runs of the same command, steady within a run, 10 and 12 ms apart.
    a = pd.concat([_steps({0: [10] * 6}, run=0), _steps({0: [12] * 6}, run=1)])
    b = pd.concat([_steps({0: [12] * 6}, run=0), _steps({0: [10] * 6}, run=1)])
    repeats = diff_stats.bootstrap_change(a, b, seed=0, resamples=400)
    assert repeats["runs_a"] == 2 and repeats["ci_low_pct"] < 0 < repeats["ci_high_pct"]
    assert "run-to-run" in diff_stats.coverage_text(repeats)
    single = diff_stats.bootstrap_change(_steps({0: [10] * 6}), _steps({0: [12] * 6}), seed=0)
    assert "not run-to-run" in diff_stats.coverage_text(single)
    assert "noise floor stands in for it" in diff_stats.coverage_text(single)


def test_too_few_steps_give_no_interval():
    change = diff_stats.bootstrap_change(_steps({0: [10]}), _steps({0: [12, 13]}))
    assert change["ci_low_pct"] is None and not change["significant"]
    assert diff_stats.verdict_text(change).startswith("cannot tell")


# ---- the run-to-run noise floor -----------------------------------------------------------------
def test_a_change_within_the_noise_floor_is_no_significant_change():
    # Steady steps, 8% slower in B: the interval is the point +8%, which excludes 0, but one run
    # per side cannot tell 8% from the run-to-run noise the default floor stands for.
    a, b = _steps({0: [10] * 6, 1: [10] * 6}), _steps({0: [10.8] * 6, 1: [10.8] * 6})
    change = diff_stats.bootstrap_change(a, b)
    assert change["ci_low_pct"] == pytest.approx(8.0) and change["excludes_zero"]
    assert change["noise_floor_pct"] == diff_stats.DEFAULT_NOISE_FLOOR_PCT == 10.0
    assert not change["significant"]
    text = diff_stats.verdict_text(change)
    assert text.startswith("no significant change: +8.0% (median 10.0 \u2192 10.8 ms) is "
                           "within the 10.0% run-to-run noise floor")
    assert "the floor, not the steps, decided it" in text
    lower = diff_stats.bootstrap_change(a, b, noise_floor_pct=5.0)
    assert lower["significant"] and lower["noise_floor_pct"] == 5.0
    assert "beyond the 5.0% run-to-run noise floor" in diff_stats.verdict_text(lower)


def test_an_interval_reaching_into_the_floor_is_not_significant():
    a = _steps({0: [10] * 6})
    b = _steps({0: [10.5, 12, 12, 12, 12, 13.5]})  # median 12; quartiles 12 and 12
    change = diff_stats.bootstrap_change(a, b, seed=0, resamples=400, noise_floor_pct=15.0)
    # The change (+20%) is beyond the floor, the interval's low end (+12.5%) is not.
    assert change["change_pct"] == pytest.approx(20.0)
    assert change["ci_low_pct"] == pytest.approx(12.5) and change["excludes_zero"]
    assert change["noise_floor_pct"] == 15.0 and not change["significant"]
    assert diff_stats.bootstrap_change(a, b, seed=0, resamples=400,
                                       noise_floor_pct=10.0)["significant"]


def test_a_noisy_run_raises_the_floor_to_its_step_spread():
    # A's steps: quartiles 8 and 12 around a median of 10, an interquartile range of 40%.
    a = _steps({0: [6, 8, 10, 12, 14]})
    b = _steps({0: [10] * 5})
    assert diff_stats.step_spread_pct(a) == pytest.approx(40.0)
    floor, source = diff_stats.noise_floor(a, b, 10.0)
    assert floor == pytest.approx(40.0) and source.startswith("A's step spread")
    assert diff_stats.noise_floor(b, b, 10.0) == (10.0, "the least floor for one run, "
                                                        "--noise-floor-pct")


def test_repeated_runs_give_the_floor_from_the_spread_of_their_medians():
    repeated = pd.concat([_steps({0: [10] * 4}, run=0), _steps({0: [12] * 4}, run=1)])
    single = _steps({0: [11] * 4})
    assert diff_stats.run_spread_pct(repeated) == pytest.approx(20.0)
    floor, source = diff_stats.noise_floor(single, repeated, 10.0)
    assert floor == pytest.approx(20.0) and source == "the spread between B's run medians"
    # Both sides repeated: runs are resampled, so the interval itself covers run-to-run noise.
    assert diff_stats.noise_floor(repeated, repeated, 10.0) == (0.0,
                                                                 "runs resampled on both sides")


def test_a_negative_noise_floor_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        diff.main(["A", "B", "--noise-floor-pct", "-1"])
    assert exit_info.value.code == 2
    assert "--noise-floor-pct: expected 0 or more, got '-1'" in capsys.readouterr().err


# ---- roles --------------------------------------------------------------------------------------
def _layout(ranks, kind="data/tensor parallel", world=None, stages=None):
    return {"ranks": ranks, "kind": kind, "world_size": world or len(ranks), "stages": stages}


def test_roles_rank_by_rank_mean_over_ranks_pipeline_ends_and_different_work():
    same = diff_compare.roles(_layout([0, 1]), _layout([0, 1]))
    assert same == ({0: "rank 0", 1: "rank 1"}, {0: "rank 0", 1: "rank 1"}, None)
    a, b, note = diff_compare.roles(_layout([0, 1]), _layout([0, 1, 2, 3]))
    assert set(a.values()) == set(b.values()) == {EVERY_RANK} and "different ranks" in note
    a, b, note = diff_compare.roles(_layout([0, 1], "pipeline", stages=2),
                                    _layout([0, 1, 2, 3], "pipeline", stages=4))
    assert a == {0: "first stage", 1: "last stage"}
    assert b == {0: "first stage", 3: "last stage"} and "middle stages" in note
    a, b, note = diff_compare.roles(_layout([0, 1], "pipeline", stages=2), _layout([0, 1]))
    assert a == b == {} and "different work" in note


# ---- tables -------------------------------------------------------------------------------------
def test_category_deltas_per_role_weighted_by_steps():
    a = pd.DataFrame({"rank": [0, 1], "steps": [3, 1], "compute": [10.0, 20.0],
                      "waiting": [1.0, 5.0], "idle": [2.0, 2.0]})
    b = pd.DataFrame({"rank": [0, 1, 2, 3], "steps": [2, 2, 2, 2],
                      "compute": [8.0, 8.0, 9.0, 9.0], "waiting": [0.0, 2.0, 0.0, 2.0],
                      "idle": [1.0, 1.0, 1.0, 1.0]})
    roles_a, roles_b, _ = diff_compare.roles(_layout([0, 1]), _layout([0, 1, 2, 3]))
    table = diff_compare.category_deltas(a, b, roles_a, roles_b).set_index("category")
    assert table.loc["compute", "a"] == pytest.approx((3 * 10 + 20) / 4)
    assert table.loc["compute", "b"] == pytest.approx(8.5)
    assert table.loc["waiting", "delta"] == pytest.approx(1.0 - 2.0)
    assert table.loc["idle", "delta"] == pytest.approx(-1.0)
    assert "transfer" not in table.index  # missing on both sides


def test_repeated_names_are_matched_by_call_stack_position():
    a = pd.DataFrame({"kind": ["op", "op", "op"], "name": ["aten::mm", "aten::mm", "aten::relu"],
                      "path": ["fwd > linear", "bwd > MmBackward", "fwd"],
                      "calls": [4, 4, 2], "total_ns": [8e6, 4e6, 2e6],
                      "self_ns": [8e6, 4e6, 2e6]})
    b = a.assign(self_ns=[8e6, 10e6, 1e6], total_ns=[8e6, 10e6, 1e6],
                 path=["fwd > linear", "bwd > MmBackward", "forward"])
    table = diff_compare.operator_deltas(a, 2, b, 2).set_index("key")
    assert table.loc["aten::mm @ bwd > MmBackward", "self_ms_delta"] == pytest.approx(3.0)
    assert table.loc["aten::mm @ fwd > linear", "self_ms_delta"] == 0
    # relu has one position in each run: matched by its name although the stacks differ.
    assert table.loc["aten::relu", "self_ms_delta"] == pytest.approx(-0.5)
    assert table.loc["aten::relu", "calls_a"] == 1.0
    assert list(table.index[:2]) == ["aten::mm @ bwd > MmBackward", "aten::relu"]


def test_collective_deltas_per_rank_step_and_busbw():
    a = pd.DataFrame({"op": ["all_reduce"], "size_bucket": ["16-32 MiB"],
                      "bucket_min_bytes": [2.0 ** 24], "count": [4], "bytes": [4 * 20e6],
                      "time_us": [4 * 10_000.0], "bus_bytes": [4 * 20e6],
                      "timed_bytes": [4 * 20e6]})
    b = pd.DataFrame({"op": ["all_reduce", "all_reduce"],
                      "size_bucket": ["1-2 MiB", "512 KiB-1 MiB"],
                      "bucket_min_bytes": [2.0 ** 20, 2.0 ** 19], "count": [40, 8],
                      "bytes": [40 * 1.5e6, 8 * 2.5e6], "time_us": [40 * 1000.0, 8 * 500.0],
                      "bus_bytes": [40 * 1.5e6, 8 * 2.5e6], "timed_bytes": [0, 0]})
    table = diff_compare.collective_deltas(a, 4, b, 4).set_index("size_bucket")
    assert table.loc["16-32 MiB", "count_a"] == 1 and table.loc["16-32 MiB", "count_b"] == 0
    assert table.loc["1-2 MiB", "count_delta"] == 10
    assert table.loc["16-32 MiB", "busbw_gbps_a"] == pytest.approx(2.0)  # 20 MB in 10 ms
    assert table.loc["1-2 MiB", "busbw_gbps_b"] == pytest.approx(1.5)
    assert list(table.index) == ["512 KiB-1 MiB", "1-2 MiB", "16-32 MiB"]


def test_findings_new_gone_changed_unchanged():
    a = pd.DataFrame({"finding": ["exposed communication", "idle", "memory"],
                      "share_pct": [30.0, 10.0, 5.0], "ranks": ["0-1", "1", "0"],
                      "evidence": ["e", "e", "e"]})
    b = pd.DataFrame({"finding": ["exposed communication", "idle", "ranks wait for rank 1"],
                      "share_pct": [30.5, 14.0, 25.0], "ranks": ["0-1", "1", "1"],
                      "evidence": ["e", "e", "e"]})
    table = diff_compare.finding_changes(a, b).set_index("finding")
    assert table["status"].to_dict() == {"ranks wait for rank 1": "new", "memory": "gone",
                                         "idle": "changed", "exposed communication": "unchanged"}
    assert table.loc["idle", "share_pct_delta"] == pytest.approx(4.0)


# ---- operators of a trace -----------------------------------------------------------------------
def _trace(events: list, steps=((0, 1000),)):
    columns = ["name", "cat", "ts_ns", "dur_ns", "tid", "correlation", "is_gpu"]
    frame = events_frame([{**dict(zip(columns, event)), "pid": "1"} for event in events])

    class Trace:
        pass

    trace = Trace()
    trace.events = frame
    trace.steps = steps_frame([(i, start, end) for i, (start, end) in enumerate(steps)])
    return trace


def test_call_stack_position_self_time_and_kernels_by_their_launch():
    trace = _trace([
        ("ProfilerStep#3", "user_annotation", 0, 900, 1, -1, False),
        ("aten::linear", "cpu_op", 10, 100, 1, -1, False),
        ("aten::mm", "cpu_op", 20, 60, 1, -1, False),
        ("cudaLaunchKernel", "cuda_runtime", 30, 10, 1, 7, False),
        ("Optimizer.step", "user_annotation", 800, 150, 1, -1, False),
        ("aten::mm", "cpu_op", 300, 40, 1, -1, False),
        ("gemm", "kernel", 50, 25, 9, 7, True),
        ("aten::add", "cpu_op", 2000, 5, 1, -1, False),  # outside the step
    ])
    table = diff_ops.rank_ops(trace).set_index(["kind", "name", "path"])
    linear = table.loc[("op", "aten::linear", "ProfilerStep")]
    assert (linear["calls"], linear["total_ns"], linear["self_ns"]) == (1, 100, 40)
    assert table.loc[("op", "aten::mm", "ProfilerStep > aten::linear"), "self_ns"] == 50
    assert table.loc[("op", "aten::mm", "ProfilerStep"), "total_ns"] == 40
    assert table.loc[("kernel", "gemm", "ProfilerStep > aten::linear > aten::mm > "
                                        "cudaLaunchKernel"), "total_ns"] == 25
    assert ("op", "aten::add", "ProfilerStep") not in table.index


def test_a_span_overlapping_the_next_step_is_no_parent_of_it():
    # The optimizer's annotation runs past the end of ProfilerStep#1 into ProfilerStep#2.
    trace = _trace([
        ("ProfilerStep#1", "user_annotation", 0, 100, 1, -1, False),
        ("Optimizer.step", "user_annotation", 90, 20, 1, -1, False),
        ("ProfilerStep#2", "user_annotation", 100, 100, 1, -1, False),
        ("aten::mm", "cpu_op", 150, 10, 1, -1, False),
    ], steps=((0, 100), (100, 200)))
    paths = set(diff_ops.rank_ops(trace)["path"])
    assert paths == {"ProfilerStep"}


# ---- output --------------------------------------------------------------------------------------
def test_the_html_page_escapes_every_name():
    class Side:
        path = "runs/<a>"
        runs = []

    empty = pd.DataFrame(columns=["role", "category", "metric", "a", "b", "delta"])
    result = {
        "verdict": "no significant change", "coverage": "c",
        "layout": {"note": None, "a": {}, "b": {}}, "problems": ["<b>bad</b>"],
        "categories": empty, "resources": empty, "pipeline": empty, "critical_path": empty,
        "operators": pd.DataFrame({"kind": ["op"], "key": ["<script>alert(1)</script>"],
                                   "calls_a": [1.0], "calls_b": [1.0], "self_ms_a": [1.0],
                                   "self_ms_b": [2.0], "self_ms_delta": [1.0]}),
        "collectives": pd.DataFrame(), "findings": pd.DataFrame(),
    }
    page = diff_output.html_page(result, Side, Side)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)" in page
    assert "&lt;b&gt;bad" in page and "runs/&lt;a&gt;" in page


def test_findings_without_a_share_are_matched_by_their_presence():
    alone = {"finding": "ranks train alone", "share_pct": float("nan"), "ranks": "0-1",
             "evidence": "e"}
    a = pd.DataFrame([alone, {"finding": "memory near capacity", "share_pct": float("nan"),
                              "ranks": "0", "evidence": "e"}])
    b = pd.DataFrame([alone])
    table = diff_compare.finding_changes(a, b).set_index("finding")
    assert table["status"].to_dict() == {"memory near capacity": "gone",
                                         "ranks train alone": "unchanged"}
