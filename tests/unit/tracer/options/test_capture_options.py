"""The capture and window options: the slow-step watch on by default with its factor, its off
switch, and the window bounds checked at start (tracer.options.config)."""

from __future__ import annotations

import pytest

from tracer.options.config import ConfigError, resolve


def test_the_slow_step_watch_is_on_by_default_and_takes_an_optional_factor():
    config, script, args = resolve(["--capture-slow-steps", "train.py", "--capture-slow-steps"])
    assert (config.capture_slow_steps, script, args) == (2.0, "train.py", ["--capture-slow-steps"])
    assert resolve(["t.py"])[0].capture_slow_steps == 2.0
    assert not resolve(["t.py"])[0].no_capture
    assert resolve(["--capture-slow-steps", "3", "train.py"])[0].capture_slow_steps == 3.0
    assert resolve(["--capture-slow-steps", "--active", "5", "t.py"])[0].active == 5
    assert resolve(["t.py"], {"RANKTRACE_CAPTURE_SLOW_STEPS": "1.5"})[0].capture_slow_steps == 1.5
    assert resolve(["--capture-slow-steps", "0", "t.py"])[0].capture_slow_steps == 0.0
    for bad in ("1", "0.5"):
        with pytest.raises(ConfigError, match="--capture-slow-steps must be > 1"):
            resolve(["--capture-slow-steps", bad, "t.py"])


def test_no_capture_switches_every_window_off_the_fixed_schedule_off():
    assert resolve(["--no-capture", "t.py"])[0].no_capture
    assert not resolve(["--no-capture", "--capture", "t.py"])[0].no_capture
    assert resolve(["t.py"], {"RANKTRACE_NO_CAPTURE": "1"})[0].no_capture


def test_window_bounds_have_defaults_and_an_active_above_the_bound_is_refused():
    config = resolve(["t.py"])[0]
    assert (config.max_window_steps, config.max_window_s, config.max_window_mb) == (
        20, 30.0, 1024.0)
    with pytest.raises(ConfigError, match="--active 21 is above --max-window-steps 20"):
        resolve(["--active", "21", "t.py"])
    assert resolve(["--active", "50", "--max-window-steps", "50", "t.py"])[0].active == 50
    for option, value, why in (("--max-window-steps", "0", "must be >= 1"),
                               ("--max-window-s", "-1", "must be >= 0"),
                               ("--max-window-mb", "inf", "must be >= 0")):
        with pytest.raises(ConfigError, match=f"{option} {why}"):
            resolve([option, value, "t.py"])
    assert resolve(["--max-window-s", "0", "--max-window-mb", "0", "t.py"])[0].max_window_s == 0
