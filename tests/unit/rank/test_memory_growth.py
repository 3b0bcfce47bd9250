"""Memory growth found by change point and slope (analysis.rank.memory_growth), on series built
step by step: a leak found with its rate and first step, through noise, after a start-up rise,
over a long run; a plateau, noise, a jump, a sawtooth and a leak that stopped found as none."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.rank.memory_growth import NOISE_FLOOR_BYTES, growth_of, noise_of

MIB = 1 << 20
BASE = 8 << 30


def _steps(n):
    return np.arange(n)


def test_a_leak_after_a_start_up_rise_is_found_from_the_step_it_begins():
    steps = _steps(200)
    # 0.5 MiB a step while warming up to step 16, flat, then 2 MiB kept every step from 20
    values = 300 * MIB + np.minimum(steps, 16) * 0.5 * MIB + np.maximum(0, steps - 20) * 2 * MIB
    growth = growth_of(steps, values)
    assert growth.bytes_per_step == pytest.approx(2 * MIB, rel=1e-6)
    assert growth.from_step == 20


def test_a_leak_through_allocator_noise_keeps_its_rate_and_start():
    rng = np.random.default_rng(0)
    steps = _steps(2000)
    values = BASE + np.maximum(0, steps - 500) * MIB + rng.normal(0, 5 * MIB, len(steps))
    growth = growth_of(steps, values)
    assert growth.bytes_per_step == pytest.approx(MIB, rel=0.02)
    assert abs(growth.from_step - 500) <= 10
    assert growth.noise_bytes == pytest.approx(5 * MIB, rel=0.35)


def test_a_long_run_is_segmented_on_medians_and_the_knee_found_to_the_step():
    rng = np.random.default_rng(1)
    steps = _steps(20_000)
    values = BASE + np.maximum(0, steps - 5000) * 0.5 * MIB + rng.normal(0, 5 * MIB, len(steps))
    growth = growth_of(steps, values)
    assert growth.bytes_per_step == pytest.approx(0.5 * MIB, rel=0.01)
    assert abs(growth.from_step - 5000) <= 60


def test_a_slow_leak_under_the_noise_of_one_step_is_found_over_the_run():
    rng = np.random.default_rng(2)
    steps = _steps(2000)
    values = BASE + steps * 0.05 * MIB + rng.normal(0, 5 * MIB, len(steps))
    growth = growth_of(steps, values)
    assert growth.bytes_per_step == pytest.approx(0.05 * MIB, rel=0.1)
    assert growth.from_step < 100


def test_repeated_readings_of_rss_give_the_leak_its_rate():
    steps = _steps(2000)
    values = 300 * MIB + (steps // 3 * 3) * 2 * MIB  # each reading shared by three steps
    assert growth_of(steps, values).bytes_per_step == pytest.approx(2 * MIB, rel=1e-3)


@pytest.mark.parametrize("name, values", [
    ("noise", BASE + np.random.default_rng(3).normal(0, 5 * MIB, 2000)),
    ("heavy-tailed noise", BASE + np.random.default_rng(4).standard_t(2, 2000) * 5 * MIB),
    ("a start-up rise, then a plateau", 300 * MIB + np.minimum(_steps(2000), 30) * 3 * MIB),
    ("one jump that stays", BASE + (_steps(2000) > 1000) * 500 * MIB),
    ("one jump at the very end", BASE + (_steps(2000) > 1990) * 500 * MIB),
    ("a sawtooth: a cache filled and emptied", 300 * MIB + (_steps(2000) % 100) * MIB),
    ("a leak that stopped", 300 * MIB + np.clip(_steps(2000) - 200, 0, 1000) * MIB),
    ("a plateau to the byte", np.full(500, 300.0 * MIB)),
])
def test_no_steady_rise_is_no_growth(name, values):
    growth = growth_of(_steps(len(values)), values)
    assert (growth.bytes_per_step, growth.from_step) == (0.0, None), name


def test_a_creep_under_one_percent_of_the_memory_held_is_no_growth():
    steps = _steps(200)
    creep = steps * 0.025 * MIB  # 5 MiB over the run, above the 4-MiB floor
    assert growth_of(steps, 580 * MIB + creep).from_step is None  # 0.9% of 585 MiB
    growth = growth_of(steps, 100 * MIB + creep)  # 4.8% of 105 MiB
    assert growth.bytes_per_step == pytest.approx(0.025 * MIB, rel=1e-6)
    assert growth.from_step == 0


def test_too_few_steps_or_unknown_values_tell_no_growth():
    assert growth_of(_steps(10), _steps(10) * 100.0 * MIB).from_step is None
    values = 300 * MIB + _steps(100) * 2.0 * MIB
    values[::2] = np.nan  # only the known half counts: still a leak of 2 MiB a step
    assert growth_of(_steps(100), values).bytes_per_step == pytest.approx(2 * MIB)


def test_noise_is_measured_around_the_trend_and_floored():
    steps = _steps(1000)
    assert noise_of(300.0 * MIB + steps * MIB) == NOISE_FLOOR_BYTES  # a clean line: no noise
    noisy = 300.0 * MIB + steps * MIB + np.random.default_rng(5).normal(0, 8 * MIB, 1000)
    assert noise_of(noisy) == pytest.approx(8 * MIB, rel=0.35)
