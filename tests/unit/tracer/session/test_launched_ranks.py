"""The ranks a script starts itself, each traced in the pytest process as its process would be
(tracer.session.launched): the wrapped function runs as rank i of nprocs in the launcher's folder
and with its options, returns its value and raises its exception with the traceback and outcome
torch gives it untraced; a rank the process group renumbers starts again under the group's rank;
a process armed at its start becomes a rank when init_process_group returns; a process that
recorded nothing stays quiet."""

from __future__ import annotations

import os
import pickle
import traceback
from pathlib import Path

import pytest
import torch.distributed as dist

import tracer
from helpers.tracer_files import read_jsonl
from tracer import schema
from tracer.options.config import TracerConfig
from tracer.parts import log
from tracer.session import launched
from tracer.session.launched import LaunchedRank, LaunchSpec, SpawnedRank
from tracer.session.rank_session import Session
from tracer.session.run_folder import LaunchInfo

ARGV = ("python", "-m", "tracer.record", "train.py", "--steps", "2")


@pytest.fixture
def spec(tmp_path, monkeypatch) -> LaunchSpec:
    """A launch of 2 processes into tmp_path/run, which holds the launcher's file; the sessions
    it opens leave SIGTERM alone (the pytest process's)."""
    monkeypatch.setattr(Session, "watch_sigterm", lambda self: None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / schema.LAUNCHER_FILE).write_text("")
    config = TracerConfig(out=str(tmp_path), no_profiler=True, no_sampler=True, no_comms=True,
                          no_scalars=True, peak_tflops=1.0)
    yield LaunchSpec(run_dir=str(run_dir), config=config, script="train.py",
                     script_args=("--steps", "2"), argv=ARGV,
                     launcher="torch.multiprocessing", nprocs=2)
    log.set_rank(None)


def manifest(spec: LaunchSpec, rank: int) -> list[dict]:
    return read_jsonl(Path(spec.run_dir) / schema.MANIFEST_FILE.format(rank=rank))


def rank_files(spec: LaunchSpec) -> list[str]:
    return sorted(name for name in os.listdir(spec.run_dir) if name.startswith("rank"))


def one_step(*args):
    tracer.step()
    return ("stepped", args)


def fails(index):
    tracer.step()
    raise RuntimeError(f"rank {index} fails on purpose")


def torchs_wrap(fn, index):
    """What torch's _wrap does with the function: calls it, and keeps the traceback's text."""
    try:
        fn(index)
    except Exception:
        return traceback.format_exc()
    return None


def test_the_function_runs_as_rank_i_of_nprocs_in_the_launchers_folder(spec, capsys):
    assert SpawnedRank(one_step, spec)(1, "a", 2) == ("stepped", (1, "a", 2))
    start, *_, end = manifest(spec, 1)
    assert (start["kind"], start["rank"], start["local_rank"], start["world_size"]) == (
        "run_start", 1, 1, 2)
    assert start["launched_by"] == "torch.multiprocessing"
    assert (start["argv"], start["script"], start["script_args"]) == (
        list(ARGV), "train.py", ["--steps", "2"])
    assert start["config"]["no_profiler"] is True and start["run_name"] == "run"
    assert (end["kind"], end["status"], end["exit_code"], end["steps"]) == (
        "run_end", "ok", 0, 1)
    assert capsys.readouterr().err.startswith("ranktrace: rank1 ok steps=1 windows=0 ")


def test_its_exception_is_raised_with_the_traceback_torch_writes_untraced(spec, capsys):
    untraced = torchs_wrap(fails, 1)
    traced = torchs_wrap(SpawnedRank(fails, spec), 1)
    assert traced == untraced and "RuntimeError: rank 1 fails on purpose" in traced
    end = manifest(spec, 1)[-1]
    assert (end["status"], end["exit_code"], end["exception"]) == (
        "failed", 1, "RuntimeError: rank 1 fails on purpose")
    assert "ranktrace: rank1 failed steps=1 " in capsys.readouterr().err


def test_a_process_that_recorded_nothing_stays_quiet_and_leaves_no_files(spec, capsys):
    assert SpawnedRank(lambda index: None, spec)(0) is None
    assert rank_files(spec) == []
    assert "ranktrace" not in capsys.readouterr().err
    assert os.listdir(spec.run_dir) == [schema.LAUNCHER_FILE]  # the folder stays


@pytest.mark.parametrize(("exc", "status", "exit_code"), [
    (RuntimeError("x"), "failed", 1), (KeyboardInterrupt(), "interrupted", 0),
    (SystemExit(3), "failed", 3), (SystemExit(None), "ok", 0)])
def test_a_spawned_process_ends_as_torchs_wrap_ends_it(exc, status, exit_code):
    outcome = launched._spawned_outcome(exc)
    assert (outcome.status, outcome.exit_code) == (status, exit_code)


def test_torchelastic_workers_take_their_rank_from_their_variables(spec):
    def elastic_wrap():
        pass

    elastic_wrap.__module__, elastic_wrap.__name__ = launched.ELASTIC_WRAP
    variables = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                 "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "job",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
                 "TORCHELASTIC_USE_AGENT_STORE": "True"}
    launch = SpawnedRank(elastic_wrap, spec)._launch(1, ("entry", {}, {0: {}, 1: variables}))
    assert launch == LaunchInfo(rank=3, local_rank=1, world_size=4, attempt=2, run_id="job",
                                master_addr="127.0.0.1", master_port=29511, agent_store=True)
    assert SpawnedRank(one_step, spec)._launch(1, ()) == LaunchInfo(rank=1, local_rank=1,
                                                                    world_size=2)


def test_a_rank_the_group_renumbers_starts_again_under_the_groups_rank(spec):
    rank = LaunchedRank(spec)
    rank.open(LaunchInfo(rank=0, local_rank=0, world_size=2))
    assert rank_files(spec) == ["rank0.manifest.jsonl.tmp", "rank0.steps.jsonl.tmp"]
    rank._group_joined(1, 3)
    assert rank.session.rank == 1 and rank_files(spec) == ["rank1.manifest.jsonl.tmp",
                                                           "rank1.steps.jsonl.tmp"]
    tracer.step()
    rank.finish(launched.ScriptOutcome(exit_code=0))
    start, end = manifest(spec, 1)
    assert (start["rank"], start["local_rank"], start["world_size"], end["steps"]) == (1, 0, 3, 1)


def test_a_rank_that_recorded_already_keeps_its_records_and_says_so(spec, capsys):
    rank = LaunchedRank(spec)
    rank.open(LaunchInfo(rank=0, local_rank=0, world_size=2))
    tracer.step()
    rank._group_joined(1, 2)
    assert rank.session.rank == 0
    rank.finish(launched.ScriptOutcome(exit_code=0))
    assert manifest(spec, 0)[-1]["steps"] == 1
    assert ("ranktrace: rank0 init_process_group made this process rank 1 of 2; its records "
            "stay those of rank 0 of 2 (it had recorded as such already)\n"
            in capsys.readouterr().err)


def test_a_rank_another_process_traces_already_is_not_traced_twice(spec, capsys):
    (Path(spec.run_dir) / "rank0.manifest.jsonl.tmp").write_text("")
    rank = LaunchedRank(spec)
    rank.open(LaunchInfo(rank=0, local_rank=0, world_size=2))
    assert rank.session is None and rank_files(spec) == ["rank0.manifest.jsonl.tmp"]
    assert f"rank 0 is traced already in {spec.run_dir}" in capsys.readouterr().err


def test_an_armed_process_becomes_a_rank_when_init_process_group_returns(spec):
    rank = LaunchedRank(spec)
    rank.arm()
    assert rank.session is None
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert rank.session is not None and rank.session.rank == 0
        assert dist.init_process_group is not rank._joined  # disarmed once joined
        tracer.step()
    finally:
        rank.finish(launched.ScriptOutcome(exit_code=0))
        dist.destroy_process_group()
    start, clock, end = manifest(spec, 0)
    assert (start["world_size"], clock["kind"], clock["world_size"]) == (1, "clock_sync", 1)
    assert (end["steps"], end["backend"]) == (1, "gloo")


def test_the_exit_finalizer_sees_the_exception_ending_the_process(spec):
    rank = LaunchedRank(spec)
    rank.open(LaunchInfo(rank=1, local_rank=1, world_size=2))
    tracer.step()
    with pytest.raises(ValueError) as raised:
        try:
            raise ValueError("boom")
        finally:  # where multiprocessing's _bootstrap runs its exit finalizers
            rank.finish_at_exit()
    assert all(not (frame.filename.startswith(os.path.dirname(tracer.__file__)))
               for frame in traceback.extract_tb(raised.value.__traceback__))
    end = manifest(spec, 1)[-1]
    assert (end["status"], end["exit_code"], end["exception"]) == (
        "failed", 1, "ValueError: boom")


def test_a_process_is_armed_when_unpickled_or_right_after_its_fork(spec, monkeypatch):
    armed = []
    monkeypatch.setattr(LaunchedRank, "arm", lambda self: armed.append(self.spec))

    class Process:
        pass

    process = Process()
    undo = launched.arm_process(process, spec, "spawn")
    pickle.loads(pickle.dumps(process._ranktrace_arm))  # as a spawned child unpickles it
    assert armed == [spec]
    undo()
    assert not hasattr(process, "_ranktrace_arm")
    undo = launched.arm_process(process, spec, "fork")
    assert not hasattr(process, "_ranktrace_arm") and launched._pending_fork == spec
    launched._arm_forked_child()  # os.register_at_fork's after_in_child
    assert armed == [spec, spec] and launched._pending_fork is None
    undo()
    launched._arm_forked_child()  # any other fork arms nothing
    assert armed == [spec, spec]
