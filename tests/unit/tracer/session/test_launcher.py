"""The process that starts the ranks itself (tracer.session.launcher), in the pytest process: its
first launch retires it as rank 0 and hands its folder to the ranks; later launches get folders
of their own; processes started one by one share one launch; it refuses where the ranks would
collide or it traced training itself, saying why; its record says what it launched and how it
ended; on SIGTERM it passes the signal on and waits for its ranks."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from helpers.tracer_files import read_jsonl
from tracer import schema
from tracer.session.launched import ELASTIC_WRAP, SpawnedRank
from tracer.session.launcher import Launcher
from tracer.session.run_folder import LaunchInfo
from tracer.session.script_end import ScriptOutcome

NOTHING = "nothing recorded by them (no steps, comm ops or traces), run files removed"


@pytest.fixture
def launching(session_in_process):
    """open(**session_options): a session of this process with a launcher."""
    def open_session(**session_options):
        return session_in_process(session_options={"make_launcher": Launcher,
                                                   **session_options}, peak_tflops=1.0)

    return open_session


def work(index):
    pass


def elastic_wrap():
    pass


elastic_wrap.__module__, elastic_wrap.__name__ = ELASTIC_WRAP


def launches(run_dir) -> list[dict]:
    path = Path(run_dir) / schema.LAUNCHER_FILE
    return read_jsonl(path if path.exists() else Path(f"{path}{schema.TEMP_SUFFIX}"))


def test_the_first_launch_retires_rank_0_and_hands_its_folder_to_the_ranks(launching):
    session = launching()
    run_dir = session.run_dir
    assert sorted(os.listdir(run_dir)) == ["rank0.manifest.jsonl.tmp", "rank0.steps.jsonl.tmp"]
    launcher = session.launcher
    traced, why = launcher.ranks(work, ("x",), 2, "spawn")
    assert why is None and isinstance(traced, SpawnedRank) and traced.fn is work
    spec = traced.spec
    assert (spec.run_dir, spec.nprocs, spec.launcher, spec.config) == (
        run_dir, 2, "torch.multiprocessing", session.config)
    assert os.listdir(run_dir) == [schema.LAUNCHER_FILE + schema.TEMP_SUFFIX]
    assert session.closed and session.run_dir is None  # no stack dump of the launcher's
    (launch,) = launches(run_dir)
    assert (launch["kind"], launch["processes"], launch["launcher"], launch["start_method"],
            launch["script"], launch["pid"]) == (
        "launch", 2, "torch.multiprocessing", "spawn", "train.py", os.getpid())
    assert launch["config"]["out"] == session.config.out
    # The launcher watches for the next launch; it stops when the script ends.
    assert mp.start_processes.__wrapped__ is not None
    session.finish(ScriptOutcome(exit_code=0))
    assert not hasattr(mp.start_processes, "__wrapped__")
    assert session.summary == (f"ranktrace: launcher ok started 2 process(es) "
                               f"(torch.multiprocessing, start method spawn) -> {NOTHING}")
    assert not os.path.exists(run_dir)


def test_a_folder_its_ranks_wrote_in_is_kept_with_how_the_script_ended(launching):
    session = launching()
    run_dir = session.run_dir
    session.launcher.ranks(work, (), 2, "fork")
    Path(run_dir, "rank1.manifest.jsonl").write_text("")  # what a rank wrote
    failure = RuntimeError("process 1 terminated")
    session.finish(ScriptOutcome(exit_code=1, exception=failure))
    launch, end = launches(run_dir)
    assert (end["kind"], end["status"], end["exit_code"], end["exception"]) == (
        "launch_end", "failed", 1, "RuntimeError: process 1 terminated")
    assert session.summary == (f"ranktrace: launcher failed started 2 process(es) "
                               f"(torch.multiprocessing, start method fork) -> {run_dir}")


def test_later_launches_get_folders_of_their_own(launching):
    session = launching()
    first = session.run_dir
    launcher = session.launcher
    specs = [launcher.ranks(work, (), 2, "spawn")[0].spec,
             launcher.ranks(work, (), 2, "spawn")[0].spec,
             launcher.ranks(elastic_wrap, ("entry", {}, {0: {"TORCHELASTIC_RESTART_COUNT": "2"}}),
                            1, "spawn")[0].spec]
    assert [s.run_dir for s in specs] == [first, f"{first}-launch2", f"{first}-attempt2"]
    assert specs[2].launcher == "torch.distributed.launcher"
    assert [launch["attempt"] if "attempt" in launch else 0
            for launch in launches(specs[2].run_dir)] == [2]


def test_a_script_that_changed_directory_still_hands_its_ranks_the_run_folder(
        session_in_process, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = session_in_process(session_options={"make_launcher": Launcher},
                                 peak_tflops=1.0, out="traces")
    assert session.run_dir == "traces/run"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    first = session.launcher.ranks(work, (), 2, "spawn")[0].spec.run_dir
    second = session.launcher.ranks(work, (), 2, "spawn")[0].spec.run_dir
    assert (first, second) == (str(tmp_path / "traces" / "run"),
                               str(tmp_path / "traces" / "run-launch2"))
    assert os.path.exists(os.path.join(first, schema.LAUNCHER_FILE + schema.TEMP_SUFFIX))


def test_processes_started_one_by_one_share_one_launch(launching):
    session = launching()
    launcher = session.launcher
    context = multiprocessing.get_context("spawn")
    first, second, helper = (context.Process(target=work, args=(i,)) for i in range(3))
    for process in (first, second):
        undo = launcher.starting(process, scripts_own=True)
        assert process._ranktrace_arm is not None
        undo()
    assert launcher.starting(helper, scripts_own=False) is None
    assert launcher.children == [first, second]
    assert [(r["processes"], r["launcher"], r["start_method"])
            for r in launches(launcher.launches[0].run_dir)] == [
        (1, "multiprocessing.Process", "spawn")] * 2
    assert launcher.launches[0].processes == 2
    rank = context.Process(target=lambda: None, args=(SpawnedRank(work, None), 0))
    assert launcher.starting(rank, scripts_own=False) is None
    assert launcher.children[-1] is rank  # torch's rank processes: kept to pass SIGTERM on
    launcher.ranks(work, (), 2, "spawn")
    assert len(launcher.launches) == 2
    assert launcher.launches[1].run_dir.endswith("-launch2")


def test_a_rank_of_torchrun_does_not_launch_and_says_why(launching, tmp_path):
    given = tmp_path / "given"
    given.mkdir()
    session = launching(launch=LaunchInfo(rank=1, local_rank=1, world_size=2),
                        run_dir=str(given))
    traced, why = session.launcher.ranks(work, (), 2, "spawn")
    assert traced is work and why == (
        "this process is rank 1 of 2 under torchrun, and ranks it started would be numbered as "
        "torchrun's: launch every rank with torchrun -m tracer.record instead")
    assert not session.launcher.active and not session.closed


def test_a_process_that_traced_training_first_does_not_launch_and_says_why(launching):
    session = launching()
    session.manual_step()
    traced, why = session.launcher.ranks(work, (), 2, "spawn")
    assert traced is work and why == (
        "this process traced training of its own first (1 step(s)): start the ranks before "
        "training, or launch every rank with torchrun -m tracer.record")
    process = multiprocessing.get_context("spawn").Process(target=work, args=(0,))
    assert session.launcher.starting(process, scripts_own=True) is None  # quietly left alone
    assert not session.launcher.active and not session.closed


def test_sigterm_is_passed_on_to_the_ranks_and_waited_for(launching, capsys):
    session = launching()
    launcher = session.launcher
    launcher.ranks(work, (), 1, "fork")
    Path(launcher.launches[0].run_dir, "rank0.manifest.jsonl").write_text("")  # a rank's
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    launcher.children.append(child)
    started = time.monotonic()
    launcher.end_by_sigterm(4.5)
    assert time.monotonic() - started < 3.0
    child.join(5)
    assert child.exitcode == -signal.SIGTERM
    _, end = launches(launcher.launches[0].run_dir)
    assert (end["status"], end["exit_code"]) == ("interrupted", -signal.SIGTERM)
    assert capsys.readouterr().err.startswith("ranktrace: launcher interrupted started 1 ")
    session.finish(ScriptOutcome(exit_code=0))  # the main thread's end waits for it, once
    assert capsys.readouterr().err == ""
