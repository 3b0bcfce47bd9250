"""The default window a captured one is compared with: the fixed schedule's first window, from
the run_start config, as torch.profiler.schedule numbers its steps."""

from pathlib import Path

import pytest

from analysis.diff import main
from analysis.diff.capture_window import capture_label, fixed_window_steps

DDP_CPU = Path(__file__).resolve().parents[2] / "data" / "ddp_cpu"


def test_the_default_window_is_the_fixed_schedules_first():
    assert fixed_window_steps({}) == [7, 8, 9]  # skip 0-4, wait 5, warm-up 6
    assert fixed_window_steps({"skip_first": 2, "wait": 0, "warmup": 1, "active": 20}) == \
        list(range(3, 23))


def test_a_capture_the_run_lacks_is_one_line_and_exit_1(capsys):
    assert main([str(DDP_CPU), "--capture", "1"]) == 1
    assert capsys.readouterr().err == (
        f"ranktrace: nothing compared: {DDP_CPU}: the run has no capture window (the tracer "
        f"opens them with --capture-slow-steps, or python -m tracer.capture)\n")


@pytest.mark.parametrize("argv", [[str(DDP_CPU)], [str(DDP_CPU), str(DDP_CPU), "--capture", "1"]])
def test_capture_takes_one_run_and_two_runs_take_no_capture(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "give B, or --capture N" in capsys.readouterr().err


def test_a_capture_sides_paths_say_which_steps_and_what_opened_the_window():
    slow = {"trigger": "slow_step", "rank": 1, "step": 50, "ratio": 2.4}
    assert capture_label(slow) == "captured on a slow step: rank 1's step 50, 2.40x its median"
    assert capture_label({"trigger": "on_demand"}) == "captured on demand"
