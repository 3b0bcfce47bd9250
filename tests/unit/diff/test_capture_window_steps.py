"""The default window a captured one is compared with: the fixed schedule's first window, from
the run_start config, as torch.profiler.schedule numbers its steps."""

from analysis.diff.capture_window import fixed_window_steps


def test_the_default_window_is_the_fixed_schedules_first():
    assert fixed_window_steps({}) == [7, 8, 9]  # skip 0-4, wait 5, warm-up 6
    assert fixed_window_steps({"skip_first": 2, "wait": 0, "warmup": 1, "active": 20}) == \
        list(range(3, 23))
