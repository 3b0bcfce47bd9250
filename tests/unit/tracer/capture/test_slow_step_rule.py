"""The slow-step rule on plain step times (tracer.capture.slow_steps.SlowStepRule): hiccups of
one or a few steps, a machine's noise, a change that holds, its size and first step, the new
reference after it, the steps of profiler windows, and where a window is placed."""

from __future__ import annotations

import random

from torch.profiler import ProfilerAction, schedule

from tracer.capture.slow_steps import (
    FAST_WEIGHT,
    HISTORY,
    MARGIN_STEPS,
    MIN_HISTORY,
    PERSIST_S,
    PERSIST_STEPS,
    WARMUP_STEPS,
    SlowStepRule,
    margin_steps,
    place_window,
)

MS = 1_000_000


def changes(durations_ms, factor: float = 2.0, windows=()) -> list[tuple]:
    """(first step, confirmed step, factor to 0.01) of each change over steps 0.. with these
    times; `windows`: steps inside a profiler window."""
    rule = SlowStepRule(factor)
    found = []
    for step, ms in enumerate(durations_ms):
        change = rule.observe(step, int(ms * MS), step in windows)
        if change is not None:
            found.append((change.step, change.confirmed_step, round(change.factor, 2)))
    return found


def test_one_slow_step_or_a_few_are_hiccups_and_never_a_change():
    # The steps of issue 37's run on 1 ms steps: 2.1, 4.8 and 2.1 times the median, alone.
    times = [1.0] * 2000
    for step, ratio in ((14, 2.1), (40, 4.8), (56, 2.1), (300, 50.0), (301, 50.0), (302, 50.0)):
        times[step] = ratio
    assert changes(times) == []
    # Three slow steps in a row, far over the factor, then the old pace: still noise.
    assert changes([10.0] * 50 + [200.0] * (PERSIST_STEPS - 1) + [10.0] * 50) == []


def test_a_change_that_holds_is_confirmed_after_persist_steps_once_it_has_lasted():
    # 1 ms steps, 60 ms from step 2000: PERSIST_STEPS slow steps, and the 5th, as 5 x 61 ms is
    # the first to last PERSIST_S.
    assert (PERSIST_STEPS, PERSIST_S) == (4, 0.3)
    times = [1.0] * 2000 + [61.0] * 100
    assert changes(times) == [(2000, 2004, 61.0)]
    # 200 ms steps: 4 are enough.
    assert changes([10.0] * 100 + [200.0] * 10) == [(100, 103, 20.0)]
    # Short slow steps must also last PERSIST_S: 4 ms steps need 75 of them.
    assert changes([1.0] * 100 + [4.0] * 200) == [(100, 174, 4.0)]


def test_noise_raises_the_bar_above_the_factor():
    rng = random.Random(7)
    # Steps of 10 ms +- 3 ms (uniform): the median absolute deviation is about 1.5 ms, so a slow
    # step needs more than 10 + 5 x 1.48 x 1.5, about 21 ms: 20 ms steps are the noise's.
    noisy = [10.0 + rng.uniform(-3, 3) for _ in range(200)]
    rule = SlowStepRule(2.0)
    for step, ms in enumerate(noisy):
        rule.observe(step, int(ms * MS))
    assert 20.5 * MS < rule.threshold_ns < 23 * MS
    assert changes(noisy + [20.0] * 100) == []
    assert changes(noisy + [25.0] * 100)[0][0] == 200
    # Quiet steps: the factor alone.
    rule = SlowStepRule(3.0)
    for step in range(100):
        rule.observe(step, 10 * MS)
    assert rule.threshold_ns == 30 * MS


def test_a_core_shared_in_time_slices_is_not_a_change_but_a_steady_slowdown_is():
    # Every other step slowed by a neighbour's time slice: half the steps slow.
    shared = [1.0] * 500 + [1.0, 4.0] * 500
    assert changes(shared) == []
    # Two in three slow is not enough either; three in four is.
    assert changes([1.0] * 500 + [1.0, 4.0, 4.0] * 300) == []
    assert changes([1.0] * 500 + [1.0, 4.0, 4.0, 4.0] * 300)[0][0] == 501
    assert FAST_WEIGHT == 2


def test_the_change_is_the_new_reference_so_a_phase_is_one_change_and_its_end_none():
    # Slow from 30% to 60% of the run, then fast again: one change, at its start.
    times = [1.0] * 600 + [61.0] * 600 + [1.0] * 800
    assert changes(times) == [(600, 604, 61.0)]
    # A second, larger slowdown later is judged against the phase it follows.
    times = [1.0] * 300 + [10.0] * 300 + [50.0] * 100
    assert [(s, f) for s, _, f in changes(times)] == [(300, 10.0), (600, 5.0)]


def test_warm_up_steps_window_steps_and_the_step_after_a_window_are_left_out():
    slow_start = [500.0] * WARMUP_STEPS + [10.0] * 50
    assert changes(slow_start) == []
    rule = SlowStepRule(2.0)
    for step in range(WARMUP_STEPS + MIN_HISTORY - 1):
        rule.observe(step, 10 * MS)
    assert rule.threshold_ns is None  # too few steps to judge
    rule.observe(WARMUP_STEPS + MIN_HISTORY - 1, 10 * MS)
    assert rule.threshold_ns == 20 * MS
    # A window's steps (slowed by the profiler) and the step after it.
    times = [10.0] * 100 + [300.0] * 10 + [10.0] * 50
    assert changes(times, windows=set(range(100, 110))) == []
    rule = SlowStepRule(2.0)
    for step in range(100):
        rule.observe(step, 10 * MS)
    rule.note_window(100, 108)  # warm-up 100, traced 101-108, and 109 left out
    assert [rule.observe(s, 300 * MS) for s in range(100, 110)] == [None] * 10
    assert rule.median_ns == 10 * MS


def test_the_median_forgets_steps_older_than_its_history():
    rule = SlowStepRule(2.0)
    for step, ms in enumerate([100.0] * (WARMUP_STEPS + HISTORY) + [60.0] * HISTORY):
        rule.observe(step, int(ms * MS))
    assert rule.median_ns == 60 * MS


def test_a_long_run_of_noise_with_a_sustained_change_late_finds_only_the_change():
    rng = random.Random(3)
    # 20,000 steps of 1 ms with a hiccup every 50 steps (2-10x), then 60 ms from step 19,900.
    times = [1.0 + rng.uniform(0, 0.1) for _ in range(20_000)]
    for step in range(25, 19_900, 50):
        times[step] *= rng.uniform(2, 10)
    for step in range(19_900, 20_000):
        times[step] = 61.0
    assert [s for s, _, _ in changes(times)] == [19_900]


# ---- where a window goes -----------------------------------------------------------------------
def test_the_margin_is_enough_steps_for_a_quarter_second_and_never_fewer_than_three():
    assert margin_steps(None) == MARGIN_STEPS
    assert margin_steps(1 * MS) == 250  # 0.25 s of 1 ms steps
    assert margin_steps(60 * MS) == 5
    assert margin_steps(400 * MS) == MARGIN_STEPS
    assert margin_steps(100 * MS, 1.0) == 10


def test_a_window_is_placed_clear_of_the_fixed_schedule():
    fixed = schedule(skip_first=5, wait=1, warmup=1, active=3, repeat=1)  # busy steps 6-9
    idle = ProfilerAction.NONE
    assert place_window(20, 3, 1, fixed, idle) == 20
    assert place_window(8, 3, 1, fixed, idle) == 12  # warm-up 11, idle step 10 after the window
    assert place_window(3, 3, 1, fixed, idle) == 12  # its idle step after it, 6, is busy
    assert place_window(2, 3, 1, fixed, idle) == 2  # warm-up 1, traced 2-4, idle 0 and 5
    always = schedule(wait=0, warmup=1, active=3, repeat=0)
    assert place_window(0, 3, 1, always, idle, search=100) is None
    # Cycling windows with room between them: the first gap that fits.
    cycling = schedule(wait=10, warmup=1, active=3, repeat=0)  # busy 10-13, 24-27, ...
    assert place_window(9, 3, 1, cycling, idle) == 16  # warm-up 15, idle 14 and 19


def test_placing_a_window_looks_at_each_step_about_once():
    calls = []
    always = schedule(wait=0, warmup=1, active=3, repeat=0)

    def counted(k):
        calls.append(k)
        return always(k)

    assert place_window(0, 20, 1, counted, ProfilerAction.NONE, search=10_000) is None
    assert len(calls) < 3 * 10_000


def test_a_burst_that_runs_into_the_change_is_not_where_it_began():
    # 1 ms steps, four of 4 ms (the machine) just before a loader turns 60 ms slow at step 100:
    # the count starts at step 96, the change at step 100 (4 ms is under the midpoint of 1 and
    # 60 ms, 30.5 ms), and its first step's ratio is 60's.
    times = [1.0] * 96 + [4.0] * 4 + [60.0] * 20
    rule = SlowStepRule(2.0)
    found = [c for step, ms in enumerate(times) if (c := rule.observe(step, int(ms * MS)))]
    assert [(c.step, c.confirmed_step, round(c.ratio, 1)) for c in found] == [(100, 104, 60.0)]
    # One 8 ms hiccup of the machine the step before 62 ms steps begin: not their start.
    assert changes([1.0] * 99 + [8.0] + [62.0] * 20)[0][:2] == (100, 104)
    # A change that builds up in stages is dated where its steps pass the midpoint of the
    # levels before and after (1 and 30 ms: the first 30 ms step, not the 3 or 9 ms ones).
    assert changes([1.0] * 100 + [3.0] * 3 + [9.0] * 3 + [30.0] * 20)[0][0] == 106


def test_the_burst_before_a_change_is_left_out_of_its_size_and_of_the_new_reference():
    # Six 4 ms steps (24 ms: not yet PERSIST_S) run into 60 ms steps from step 100: confirmed
    # at step 104, with 11 steps counted, 6 of them the burst's. The change's size is that of
    # its own steps (60 ms, not the 4 ms median of the 11), and the 60 ms steps after it are
    # its pace, not another change.
    times = [1.0] * 94 + [4.0] * 6 + [60.0] * 100
    rule = SlowStepRule(2.0)
    found = [c for step, ms in enumerate(times) if (c := rule.observe(step, int(ms * MS)))]
    assert [(c.step, c.confirmed_step, c.after_ns / MS, round(c.factor, 1)) for c in found] == [
        (100, 104, 60.0, 60.0)]
