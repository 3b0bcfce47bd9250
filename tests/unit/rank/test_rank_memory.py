"""One rank's memory figures from its step records and memory profiles
(analysis.rank.memory_figures): the peak and its step, headroom and the steps left before the
device is full on CUDA, RSS on CPU, the analysed steps only, the categories of the highest
window on the measured device, and how they grow between windows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.core.contracts import MEASURE_CUDA, MEASURE_RSS
from analysis.rank.memory_figures import (
    categories_growth,
    rank_memory,
    reading_points,
    rss_at_step_ends,
)
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


def _rss_records(every=7, leak_from=20, steps=200, faster_from=None, start_up_mib=0.0):
    """Step records of 10 ms steps whose RSS was read every `every` steps, 4 ms into a step (as
    the sampler reads it): 300 MiB, and 2 MiB more for each step from `leak_from` on whose
    allocation (at 2 ms into the step) came before the reading (4 MiB from `faster_from` on);
    `start_up_mib`: less at first, by that much at step 0, halving every 2 steps (a start-up's
    rise: the allocator's heap and the first steps' buffers)."""
    rows, reading = [], None
    for step in range(steps):
        start = step * 10_000_000
        if step % every == 0:
            t = start + 4_000_000
            kept = max(0, step - leak_from + 1)  # this step's tensor is in by 4 ms
            faster = max(0, step - faster_from + 1) if faster_from is not None else 0
            start_up = start_up_mib * 0.5 ** (step / 2)
            reading = (t, (300 - start_up) * MIB + (kept + faster) * 2 * MIB)
        rows.append({"step": step, "start_ns": start, "end_ns": start + 10_000_000,
                     "rss_t_ns": reading[0], "rss_bytes": reading[1]})
    return pd.DataFrame(rows)


def test_rss_shared_by_steps_is_interpolated_and_the_leak_dated_from_the_readings():
    records = _rss_records()
    figure = rank_memory(1, records, analysed=range(1, 200))
    assert figure.growth_bytes_per_step == pytest.approx(2 * MIB, rel=0.02)
    # Readings at steps 14 and 21 (2 tensors kept by then), 28 (9): the line through them meets
    # the level before at 18.4, one step before the first tensor (step 20, at 19.2): a line
    # through a staircase's readings after each stair leads it by one step. The records alone
    # (each step the last reading by its end) would say 21 or later.
    assert figure.growth_from_step in (19, 20)
    assert figure.peak_bytes == 300 * MIB + 177 * 2 * MIB  # the last reading, at step 196


@pytest.mark.parametrize("every", [8, 9, 10, 11])
def test_a_leak_after_a_start_up_rise_is_dated_from_the_level_just_before_it(every):
    # RSS rises 20 MiB over the first steps, holds, and grows from step 20: the readings before
    # the leak are the start-up's as much as the level's (as on a loaded machine, where the
    # sampler reads every 8 to 11 steps); the line through the leak's readings meets the level
    # of the last one before it, not a level averaged with the start-up's
    records = _rss_records(every=every, start_up_mib=20)
    figure = rank_memory(1, records, analysed=range(1, 200))
    assert figure.growth_bytes_per_step == pytest.approx(2 * MIB, rel=0.02)
    assert figure.growth_from_step in (19, 20)


def _irregular_rss_records(seed, leak_from=20, steps=200):
    """As _rss_records with a 20 MiB start-up rise, read at random: 6 to 12 steps apart, at any
    time in a step (a loaded sampler's), so that the leak's readings scatter about their line
    by up to a stair."""
    rng = np.random.default_rng(seed)
    rows, reading, next_read = [], None, 0
    for step in range(steps):
        start = step * 10_000_000
        if step >= next_read:
            offset = int(rng.integers(0, 10_000_000))
            kept = max(0, step - leak_from + (offset >= 2_000_000))
            reading = (start + offset, (300 - 20 * 0.5 ** (step / 2) + kept * 2) * MIB)
            next_read = step + int(rng.integers(6, 13))
        rows.append({"step": step, "start_ns": start, "end_ns": start + 10_000_000,
                     "rss_t_ns": reading[0], "rss_bytes": reading[1]})
    return pd.DataFrame(rows)


def test_a_leak_read_at_random_times_is_dated_within_two_steps_of_its_first_tensor():
    found = [rank_memory(1, _irregular_rss_records(seed), analysed=range(1, 200))
             for seed in range(40)]
    assert all(f.growth_bytes_per_step == pytest.approx(2 * MIB, rel=0.05) for f in found)
    # the first tensor is kept at step 20, 2 ms in: the line through readings taken anywhere in
    # their steps (80% of them after the step's tensor) meets the level at 18.7, give or take
    # the scatter of the readings near it
    dated = [f.growth_from_step for f in found]
    assert set(dated) <= {18, 19, 20, 21} and dated.count(19) >= 30


def test_reading_points_stand_where_each_reading_was_taken():
    positions, values = reading_points(_rss_records(), analysed=range(1, 30))
    # readings 4 ms into steps 0 (carried by steps 1-6), 7, 14, 21, 28: at k - 1 + 0.4
    assert positions.tolist() == pytest.approx([-0.6, 6.4, 13.4, 20.4, 27.4])
    assert (values[3] - values[2]) == 2 * 2 * MIB  # steps 20 and 21 kept their tensors
    at_ends = rss_at_step_ends(_rss_records().rename(columns={"rss_bytes": "rss"}))
    assert at_ends[10] == pytest.approx(300 * MIB)  # flat between the readings at 0 and 14
    # step 24 ends at 250 ms, between the readings at 214 ms (304 MiB) and 284 ms (318 MiB)
    assert at_ends[24] == pytest.approx((304 + (250 - 214) / 70 * 14) * MIB, rel=1e-9)


def test_a_leak_that_speeds_up_is_dated_from_the_readings_near_its_start():
    records = _rss_records(every=15, leak_from=1000, steps=2000, faster_from=1500)
    figure = rank_memory(0, records, analysed=range(1, 2000))
    assert abs(figure.growth_from_step - 1000) <= 1
    # the rate over the whole stretch: 2 MiB a step, then 4
    assert 2 * MIB < figure.growth_bytes_per_step < 4 * MIB


def test_steps_after_the_last_reading_do_not_end_a_leak_with_a_plateau():
    records = _rss_records()
    # the sampler's last reading is at step 182: the 17 steps after it carry it, unknown
    last = records.loc[182, ["rss_t_ns", "rss_bytes"]].to_numpy()
    records.loc[183:, ["rss_t_ns", "rss_bytes"]] = last
    at_ends = rss_at_step_ends(records.rename(columns={"rss_bytes": "rss"}))
    assert np.isnan(at_ends[182:]).all() and not np.isnan(at_ends[1:182]).any()
    figure = rank_memory(1, records, analysed=range(1, 200))
    assert figure.growth_bytes_per_step == pytest.approx(2 * MIB, rel=0.02)
    assert figure.growth_from_step in (19, 20)


def test_a_leak_from_the_first_step_is_not_dated_before_the_first_reading():
    figure = rank_memory(1, _rss_records(leak_from=0, steps=120), analysed=range(1, 120))
    assert figure.growth_bytes_per_step == pytest.approx(2 * MIB, rel=0.02)
    assert 0 <= figure.growth_from_step <= 2
