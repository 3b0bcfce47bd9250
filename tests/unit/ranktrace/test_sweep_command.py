"""The sweep command (ranktrace.sweep): how it splits its command line, plans its launches and
runs the scaling study in its own process; and the tracer, which imports none of the analysis."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import tracer
from helpers.launch import REPO
from ranktrace import sweep

# The `python -m` entries: tracer.sweep is the one declared import of ranktrace.sweep
# (pyproject.toml's import contracts); a __main__ module runs its command when imported.
COMMAND_ENTRIES = {"tracer.sweep", "tracer.capture.__main__"}


def test_the_sweep_splits_its_command_line():
    parser = sweep.build_parser()
    words, tracer_words, script = sweep.split_words(parser, [
        "--nproc", "1,2", "--active", "2", "--repeats=2", "--no-sampler", "train.py",
        "--steps", "5", "--nproc", "9"])
    assert words == ["--nproc", "1,2", "--repeats=2"]
    assert tracer_words == ["--active", "2", "--no-sampler"]
    assert script == ["train.py", "--steps", "5", "--nproc", "9"]
    args = parser.parse_args(words + ["--nnodes", "1,2", "--node-rank", "1"])
    plan = sweep.launches(args)
    assert [(p["world_size"], p["nnodes"], p["repeat"]) for p in plan] == [
        (2, 2, 0), (2, 2, 1), (4, 2, 0), (4, 2, 1)]  # node 1 takes no part in 1-node launches
    command = sweep.torchrun_command(plan[0], args, sweep.Path("S"), tracer_words, script)
    assert "--nnodes=2" in command and "--node-rank=1" in command
    assert command[command.index("--run-name") + 1] == "ws2-n2-r0"
    with pytest.raises(SystemExit):
        sweep.main(["--nproc", "1", "--run-name", "x", "train.py"])
    with pytest.raises(SystemExit):
        sweep.main(["--nproc", "0", "train.py"])


def test_the_sweep_passes_both_forms_of_a_boolean_to_the_tracer():
    words, tracer_words, script = sweep.split_words(sweep.build_parser(), [
        "--nproc", "1,2", "--no-record-shapes", "--comms", "--capture-slow-steps", "train.py",
        "--no-comms"])
    assert words == ["--nproc", "1,2"]
    assert tracer_words == ["--no-record-shapes", "--comms", "--capture-slow-steps"]
    assert script == ["train.py", "--no-comms"]


def test_the_scaling_report_runs_in_the_sweeps_process_and_a_failure_is_named(tmp_path,
                                                                              capsys):
    empty = tmp_path / "no-runs"
    empty.mkdir()
    assert sweep.run_scaling_report([str(empty), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"ranktrace: error: {empty}: neither a run folder nor a folder of runs",
        f"ranktrace sweep: the scaling report (python -m analysis.scaling {empty} --format "
        f"json) exited with 1"]


def test_a_scaling_report_that_rejects_its_options_gives_its_exit_code(capsys):
    assert sweep.run_scaling_report(["--format", "yaml"]) == 2  # argparse's usage error
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ranktrace sweep: the scaling report (python -m analysis.scaling --format yaml) "
        "exited with 2")


@pytest.mark.slow  # starts Python processes
def test_the_tracers_modules_import_nothing_of_the_analysis():
    modules = sorted(m.name for m in pkgutil.walk_packages(tracer.__path__, "tracer.")
                     if m.name not in COMMAND_ENTRIES)
    assert {"tracer.record", "tracer.session.rank_session", "tracer.comms.recorder",
            "tracer.probes.device_sampler", "tracer.capture.capture_command"} <= set(modules)
    code = (f"import importlib, sys\n"
            f"for name in {modules!r}:\n"
            f"    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('analysis', "
            f"'ranktrace')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
