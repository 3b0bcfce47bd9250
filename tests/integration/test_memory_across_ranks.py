"""Memory across ranks on issue 40's 2-rank CPU case (tests/scripts/memory_ddp.py), traced as a
user would: the step records' RSS against the sampler's, rank 1's growth from the step its leak
begins, rank 0's extra buffer as an imbalance, and torch's memory categories at the peak. Two
shared runs (tests/helpers/runs.py: memory-leak, memory-buffer) serve every assertion."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import open_run
from helpers import tracer_files as h
from tracer import schema

MIB = 1 << 20
# tests/scripts/memory_ddp.py's model: three 256 x 256 linear layers with biases
PARAMETERS = 3 * (256 * 256 + 256)


@pytest.fixture(scope="module")
def leak(shared_runs):
    return shared_runs["memory-leak"]


@pytest.fixture(scope="module")
def leak_memory(leak):
    return open_run(leak.run_dir, use_cache=False).document()


@pytest.fixture(scope="module")
def buffer_memory(shared_runs):
    return open_run(shared_runs["memory-buffer"].run_dir, use_cache=False).document()


def _rows(document):
    return {row["rank"]: row for row in document["memory"]["ranks"]}


def test_step_records_rss_agrees_with_the_samplers_readings(leak):
    for rank in (0, 1):
        steps = h.steps(leak.run_dir, rank)
        samples = h.read_jsonl(leak.run_dir / schema.SAMPLES_FILE.format(rank=rank),
                               schema.DeviceSample)
        # the sampler's readings while the script trained (after it, the script frees memory)
        samples = [s for s in samples if s.t_ns <= steps[-1].end_ns]
        assert len(steps) == 200 and len(samples) >= 10
        times = np.array([s.t_ns for s in samples], dtype=np.float64)
        sampled = np.array([s.rss_bytes for s in samples], dtype=np.float64)
        compared = 0
        for step in steps[1:]:  # step 0 may end before the first reading
            # each record's reading was taken by its step's end, shortly before ...
            assert 0 <= step.end_ns - step.rss_t_ns < 0.5e9, step
            if not times[0] <= step.rss_t_ns <= times[-1]:
                continue
            # ... and agrees within 5% with the sampler's readings at that time (between the
            # two around it: rank 1 grows 2 MiB a step, about 150 MiB a second)
            expected = np.interp(step.rss_t_ns, times, sampled)
            assert step.rss_bytes == pytest.approx(expected, rel=0.05), step
            compared += 1
        assert compared >= 150
    # rank 0 holds its 256 MiB buffer to the last step: no record after the script freed it
    last = h.steps(leak.run_dir, 0)[-1]
    first_rank1 = h.steps(leak.run_dir, 1)[5]
    assert last.rss_bytes - first_rank1.rss_bytes > 200 * MIB


def test_rank_1_grows_2_mib_a_step_from_step_20_and_rank_0_does_not(leak_memory):
    rows = _rows(leak_memory)
    assert rows[1]["measure"] == "rss"
    assert rows[1]["growth_bytes_per_step"] == pytest.approx(2 * MIB, rel=0.2)
    assert abs(rows[1]["growth_from_step"] - 20) <= 5
    assert rows[0]["growth_bytes_per_step"] < 0.2 * MIB


def test_the_verdict_names_rank_1s_memory(leak_memory):
    memory_lines = [line for line in leak_memory["verdict"]["lines"]
                    if line.startswith("Memory:")]
    assert len(memory_lines) == 1 and memory_lines[0].startswith("Memory: rank 1 grows ")
    (grows,) = [f for f in leak_memory["memory"]["findings"] if f["finding"] == "memory grows"]
    assert grows["ranks"] == "1"


def test_rank_0s_buffer_is_an_imbalance_named_with_its_size(buffer_memory):
    rows = _rows(buffer_memory)
    assert rows[0]["peak_bytes"] - rows[1]["peak_bytes"] == pytest.approx(256 * MIB, rel=0.1)
    assert rows[0]["median_rank"] == 1
    (imbalance,) = [f for f in buffer_memory["memory"]["findings"]
                    if f["finding"] == "memory imbalance"]
    assert imbalance["ranks"] == "0"
    assert imbalance["evidence"].startswith("Rank 0 peaks ")
    assert all(row["growth_bytes_per_step"] == 0 for row in rows.values())


def test_parameters_at_the_peak_are_4_bytes_per_parameter_on_both_ranks(buffer_memory):
    for row in _rows(buffer_memory).values():
        assert row["categories_at_peak"]["parameter"] == pytest.approx(4 * PARAMETERS,
                                                                        rel=0.01)
        # Adam: two state tensors per parameter
        assert row["categories_at_peak"]["optimizer_state"] >= 8 * PARAMETERS
        assert row["categories_steps"] == [7, 9]
