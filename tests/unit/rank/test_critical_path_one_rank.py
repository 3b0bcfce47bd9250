"""The single-rank critical path on GPU traces (analysis.rank.one_rank_path,
docs/critical-path.md, "One rank on a GPU"): exact paths on hand-built traces, and the real
Kineto trace's steps covered exactly."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core import dag
from analysis.rank import gpu_graph
from analysis.rank import one_rank_path as cp
from analysis.run.analysed_run import open_run
from analysis.run.loading import load_run_path
from helpers.launch import DATA
from helpers.synthetic import TraceBuilder, trace_name


def load_one(builder: TraceBuilder, tmp_path):
    builder.write(tmp_path / "t" / trace_name(0))
    return load_run_path(tmp_path / "t", use_cache=False).ranks[0]


def categories_us(result) -> dict:
    path = result.critical_path
    return {row.category: round(row.ms * 1000, 3) for row in path.itertuples()}


def three_launches(last="compute") -> TraceBuilder:
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 100)
    b.op("aten::a", 5, 14).op("aten::b", 14, 24).op("aten::c", 24, 34)
    b.compute(13, 40, launch_at=10)
    b.compute(40, 60, launch_at=20)
    getattr(b, last)(60, 120, stream=7, launch_at=30)
    return b


def test_three_launches_the_last_kernel_ends_the_step(tmp_path):
    # The host launches three kernels; they queue on one stream, the last ends after the
    # ProfilerStep: host up to the first launch (6 us in ops, 5 idle), its launch latency
    # (kernel start 13 - launch end 11), then the three kernels back to back.
    result = cp.analyse(load_one(three_launches(), tmp_path))
    assert categories_us(result) == {"cpu": 6.0, "idle": 5.0, "launch": 2.0, "kernel": 107.0}
    steps = result.critical_path_steps
    assert steps["path_ms"].tolist() == [pytest.approx(0.120)]
    assert steps["step_ms"].tolist() == [pytest.approx(0.100)]
    segments = result.critical_path_segments
    assert segments["category"].tolist() == ["cpu", "idle", "launch", "kernel"] or \
        segments["category"].tolist() == ["idle", "cpu", "launch", "kernel"]
    assert segments["end_ns"].iloc[-1] - segments["start_ns"].iloc[0] == 120_000


def test_nccl_kernels_are_communication(tmp_path):
    result = cp.analyse(load_one(three_launches("nccl"), tmp_path))
    assert categories_us(result) == {"cpu": 6.0, "idle": 5.0, "launch": 2.0, "kernel": 47.0,
                                     "comm_kernel": 60.0}


def test_the_host_waiting_in_a_synchronisation_is_not_on_the_path(tmp_path):
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 62)
    b.op("aten::a", 0, 10).op("aten::b", 52, 60)
    b.compute(5, 50, launch_at=2)
    b.op("cudaDeviceSynchronize", 10, 52, cat="cuda_runtime")
    b.compute(58, 70, launch_at=55)
    result = cp.analyse(load_one(b, tmp_path))
    # cpu: the host before the first launch (3), the synchronisation's return after the kernel
    # it waited for (2), the host until the second launch returned (4); the 40 us of waiting
    # are slack: the kernel they waited for is on the path instead.
    assert categories_us(result) == {"cpu": 9.0, "launch": 4.0, "kernel": 57.0}
    assert result.critical_path_steps["path_ms"].tolist() == [pytest.approx(0.070)]


def test_a_trace_without_device_ops_has_no_path(tmp_path):
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 50).op("aten::a", 5, 40)
    result = cp.analyse(load_one(b, tmp_path))
    assert result.critical_path_steps.empty and result.what_if == []


def test_what_if_launch_latency_removed_is_propagated_exactly(tmp_path):
    trace = load_one(three_launches(), tmp_path)
    graph = gpu_graph.build(trace.events, trace.steps)
    alone = cp.steps_alone(graph)
    # Propagating the measured durations gives back every measured time.
    assert np.array_equal(dag.propagate(alone, alone.duration)[:, 0], graph.time)
    answers = {w["kind"]: w for w in cp.what_if(graph, 0)}
    # The first kernel starts at its launch's end (11, not 13): the chain behind it 2 us earlier.
    assert answers["launch_latency_removed"]["saved_ms_per_step"] == pytest.approx(0.002)


def test_a_run_of_one_rank_reports_its_own_path(tmp_path):
    three_launches().write(tmp_path / "run" / trace_name(0))
    run = open_run(tmp_path / "run", use_cache=False)
    assert run.critical is not None
    assert run.critical.critical_path_steps["path_ms"].tolist() == [pytest.approx(0.120)]
    assert run.document()["critical_path"][0]["by_rank"]


@pytest.fixture(scope="module")
def resnet():
    trace = load_run_path(DATA / "kineto" / "resnet50_num_workers_0", use_cache=False).ranks[0]
    return trace, cp.analyse(trace)


def test_resnet_steps_are_covered_exactly(resnet):
    trace, result = resnet
    steps = result.critical_path_steps
    assert steps["step"].tolist() == trace.steps["step"].tolist()
    sums = result.critical_path.groupby("step")["ms"].sum()
    assert np.allclose(sums.to_numpy(), steps["path_ms"].to_numpy(), atol=1e-6)
    # The path runs from the ProfilerStep's start to the step's last event: the optimizer's
    # kernels run 9-16 ms past the ProfilerStep's end.
    tail = steps["path_ms"] - steps["step_ms"]
    assert (tail > 8).all() and (tail < 17).all()
    segments = result.critical_path_segments
    for _step, rows in segments.groupby("step"):
        assert (rows["start_ns"].to_numpy()[1:] == rows["end_ns"].to_numpy()[:-1]).all()
    assert set(result.critical_path["category"]) <= set(gpu_graph.CATEGORIES)


def test_resnet_graph_propagates_to_its_measured_times(resnet):
    trace, _ = resnet
    graph = gpu_graph.build(trace.events, trace.steps)
    alone = cp.steps_alone(graph)
    assert np.array_equal(dag.propagate(alone, alone.duration)[:, 0], graph.time)
    # The what-if's one pass over the unsorted edges gives dag.propagate's times, for any
    # number of scenarios.
    unsorted = cp.steps_alone(graph, sort=False)
    assert unsorted.level_starts is None and np.array_equal(unsorted.duration, alone.duration)
    assert np.array_equal(cp.propagate_once(unsorted, unsorted.duration)[:, 0], graph.time)
    scenarios = np.column_stack([alone.duration, alone.duration // 2, alone.duration * 3])
    once = cp.propagate_once(unsorted, scenarios)
    assert once.shape == (len(graph.time), 3) and (once[:, 1] < graph.time).any()
    assert np.array_equal(once, dag.propagate(alone, scenarios))
