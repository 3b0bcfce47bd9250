"""One rank's memory figures from its step records and memory profiles
(analysis.rank.memory_figures): the peak and its step, headroom and the steps left before the
device is full on CUDA, RSS on CPU, the analysed steps only, the categories of the highest
window on the measured device, and how they grow between windows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.rank.memory_figures import MEASURE_CUDA, MEASURE_RSS, categories_growth, rank_memory
from tracer import schema

MIB = 1 << 20
GIB = 1 << 30


def _cuda_steps(n=100, leak_from=40, leak=64 * MIB):
    steps = np.arange(n)
    allocated = 20 * GIB + np.maximum(0, steps - leak_from) * leak
    return pd.DataFrame({"step": steps, "start_ns": steps * 10, "end_ns": steps * 10 + 9,
                         "cuda_peak_allocated_bytes": allocated,
                         "cuda_peak_reserved_bytes": allocated + 2 * GIB,
                         "cuda_total_bytes": 80 * GIB, "rss_bytes": 3 * GIB})


def _profile(first, categories, device="cuda:0", peak_step=None):
    return schema.MemoryProfileRecord(
        rank=0, t_ns=1, device=device, first_step=first, last_step=first + 2,
        peak_bytes=sum(categories.values()), peak_step=peak_step,
        categories={name: categories.get(name, 0) for name in schema.MEMORY_CATEGORIES})


def test_cuda_rank_peak_headroom_growth_and_the_step_the_device_is_full():
    figure = rank_memory(3, _cuda_steps())
    assert figure.measure == MEASURE_CUDA
    last = 20 * GIB + 59 * 64 * MIB  # step 99's allocated peak
    assert (figure.peak_bytes, figure.peak_step) == (last, 99)
    assert figure.reserved_bytes == last + 2 * GIB
    assert figure.device_total_bytes == 80 * GIB
    assert figure.headroom_pct == pytest.approx((80 * GIB - last - 2 * GIB) / (80 * GIB) * 100)
    assert figure.growth_bytes_per_step == pytest.approx(64 * MIB)
    assert figure.growth_from_step == 40
    room = 80 * GIB - (last + 2 * GIB)  # above the last step's reserved memory
    assert figure.steps_to_full == pytest.approx(room / (64 * MIB))
    assert figure.full_at_step == 99 + math.ceil(room / (64 * MIB))


def test_cpu_rank_is_measured_by_rss_with_no_device_figures():
    steps = pd.DataFrame({"step": range(50), "rss_bytes": [500 * MIB + 3 * MIB * (s == 30)
                                                           for s in range(50)]})
    figure = rank_memory(1, steps)
    assert figure.measure == MEASURE_RSS
    assert (figure.peak_bytes, figure.peak_step) == (503 * MIB, 30)
    assert math.isnan(figure.device_total_bytes) and math.isnan(figure.headroom_pct)
    assert (figure.growth_bytes_per_step, figure.growth_from_step) == (0.0, None)
    assert math.isnan(figure.steps_to_full) and figure.full_at_step is None


def test_only_the_analysed_steps_count():
    figure = rank_memory(0, _cuda_steps(), analysed=range(1, 41))
    assert (figure.steps, figure.first_step, figure.last_step) == (40, 1, 40)
    assert figure.peak_bytes == 20 * GIB and figure.growth_bytes_per_step == 0.0


def test_a_rank_without_any_memory_value_has_no_figures():
    assert rank_memory(0, pd.DataFrame({"step": [1, 2], "end_ns": [5, 9]})) is None
    assert rank_memory(0, pd.DataFrame()) is None


def test_categories_come_from_the_highest_window_of_the_measured_device():
    profiles = [_profile(7, {"parameter": 4 * GIB, "activation": 9 * GIB}),
                _profile(47, {"parameter": 4 * GIB, "activation": 11 * GIB}),
                _profile(90, {"parameter": 40 * GIB}, device="cpu")]  # the host's: left out
    figure = rank_memory(0, _cuda_steps(), profiles)
    assert figure.categories_at_peak["activation"] == 11 * GIB
    assert figure.categories_steps == (47, 49)
    assert figure.categories_peak_bytes == 15 * GIB
    # from step 9 to step 49 (each window's last step, no peak step given): +2 GiB
    assert figure.categories_growth_per_step["activation"] == pytest.approx(2 * GIB / 40)
    assert figure.categories_growth_per_step["parameter"] == 0


def test_categories_grow_only_between_windows_at_different_steps():
    one = _profile(7, {"parameter": 100}, peak_step=8)
    assert categories_growth([one]) is None
    assert categories_growth([one, _profile(7, {"parameter": 300}, peak_step=8)]) is None
    later = _profile(17, {"parameter": 100, "gradient": 50}, peak_step=18)
    assert categories_growth([later, one])["gradient"] == 5.0
