"""Scripts that start their own ranks, traced unchanged with ``python -m tracer.record``: PyTorch's
DDP tutorial (`demo_basic(rank, world_size)`, a toy model, `mp.spawn`, 2 gloo ranks on CPU;
tests/scripts/spawn_ddp.py), and the same training started by start_processes with fork and
join=False, by multiprocessing.Process with forkserver, and by elastic_launch.

The runs, each recorded once and read by several tests:
* `tutorial`: 30 steps with rank 1 late by a 30 ms busy loop before every step, default options,
  recorded alone (its timings are asserted);
* `untraced`: the same, untraced, with rank 1 raising after its last step: the losses and the
  error text the traced runs must give;
* `crash`: that crash traced, the ranks started by start_processes (fork, join=False);
* `hang`: rank 1 of ranks started as multiprocessing.Process (forkserver) sleeping for ever, and
  SIGTERM to the launching process, as `timeout` sends it;
* `elastic`: 3 steps of ranks started by elastic_launch.
The compiled case (`make test-compiled`) records its own two runs.
"""

from __future__ import annotations

import re
import signal
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from analysis import open_run
from helpers import tracer_files as h
from helpers.alone import alone
from helpers.launch import REPO, launch, start, torchrun_env
from tracer import schema

SCRIPT = "tests/scripts/spawn_ddp.py"
STEPS = 30
STRAGGLE_MS = 30
STRAGGLE = ("--straggle", f"1:{STRAGGLE_MS}")
CRASH = ("--crash", f"1:{STEPS}")  # rank 1 raises after its last step
ERROR = f"RuntimeError: rank 1 fails on purpose at step {STEPS}"
# The ranks' exception, as torch.multiprocessing's parent raises it (pids and times differ).
_TORCH_WARNING = re.compile(r"^W\d{4} .*$\n", re.M)


def record(folder: Path, *args, traced: bool = True, timed: bool = False):
    """spawn_ddp.py with `args` (its losses to folder/losses.rank{R}), under the tracer with
    default options (its runs in folder/traces) unless `traced` is false."""
    folder.mkdir(parents=True)
    tracer = ["--out", folder / "traces"] if traced else None
    with alone() if timed else nullcontext():
        result = launch(SCRIPT, "--steps", str(STEPS), "--losses", folder / "losses", *args,
                        tracer=tracer, timeout=300)
    return result


def losses(folder: Path, rank: int) -> list[str]:
    return h.losses(folder / f"losses.rank{rank}")


def launcher_records(run_dir: Path) -> list:
    return h.read_jsonl(run_dir / schema.LAUNCHER_FILE, schema.LauncherRecord)


def parents_error(stderr: str) -> str:
    """The launching process's traceback: stderr as the script wrote it from its traceback on
    (before it, the ranks' Kineto lines, which two processes can split into bare newlines),
    without torch's own timestamped warnings (which name pids)."""
    text = _TORCH_WARNING.sub("", h.script_stderr(stderr))
    return text[text.index("Traceback (most recent call last):"):]


# The module's runs: name -> (spawn_ddp.py's arguments, traced, timed).
RUNS = {"tutorial": (STRAGGLE, True, True),
        "untraced": ((*STRAGGLE, *CRASH, "--no-join", "--start-method", "fork"), False, False),
        "crash": ((*CRASH, "--no-join", "--start-method", "fork"), True, False)}


class Runs:
    """`runs[name]`: the run of RUNS recorded on first use, then shared; `root` holds them."""

    def __init__(self, root: Path):
        self.root = root
        self._done: dict = {}

    def __getitem__(self, name: str):
        if name not in self._done:
            args, traced, timed = RUNS[name]
            self._done[name] = record(self.root / name, *args, traced=traced, timed=timed)
        return self._done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("spawned"))


def tutorial(runs) -> tuple[Path, object]:
    result = runs["tutorial"]
    assert result.returncode == 0, result.stderr[-3000:]
    return h.only_run_dir(runs.root / "tutorial" / "traces"), result


def test_the_tutorial_traced_unchanged_analyses_two_ranks_of_30_steps(runs):
    run_dir, result = tutorial(runs)
    ranks = h.summaries(result.stderr)
    assert {rank: (s["status"], s["steps"], s["run_dir"]) for rank, s in ranks.items()} == {
        rank: ("ok", str(STEPS), str(run_dir)) for rank in (0, 1)}
    last = [line for line in result.stderr.splitlines() if line.startswith("ranktrace:")][-1]
    assert last == (f"ranktrace: launcher ok started 2 process(es) (torch.multiprocessing, "
                    f"start method spawn) -> {run_dir}")
    document = open_run(run_dir, use_cache=False).document()
    # The launcher's file is no rank's, and nothing the analysis reads or complains about.
    assert sorted(row["rank"] for row in document["ranks"]) == [0, 1]
    assert (document["run"]["world_size"], document["run"]["ranks_analysed"]) == (2, 2)
    assert document["problems"] == []
    for rank in (0, 1):
        assert [s.step for s in h.steps(run_dir, rank)] == list(range(STEPS))
        (start,) = h.of_kind(h.manifest(run_dir, rank), schema.RunStart)
        assert (start.rank, start.local_rank, start.world_size, start.launched_by) == (
            rank, rank, 2, "torch.multiprocessing")
        assert start.argv[1:4] == ["-m", "tracer.record", "--out"] and start.script == SCRIPT
        (clock,) = h.of_kind(h.manifest(run_dir, rank), schema.ClockSync)
        assert (clock.world_size, clock.round_trips) == (2, 0 if rank == 0 else 8)
        assert len(h.traces(run_dir, rank)) == 1  # the default window: steps 7-9
        assert h.run_end(run_dir, rank).samples > 0


def test_every_step_of_each_rank_holds_ddps_all_reduce(runs):
    run_dir, _ = tutorial(runs)
    for rank in (0, 1):
        comms = h.read_jsonl(h.jsonl_path(run_dir, schema.COMMS_FILE, rank), schema.CommRecord)
        steps = h.steps(run_dir, rank)
        assert len(steps) == STEPS
        for step in steps:
            buckets = [c for c in comms if c.step == step.step and c.op == "all_reduce"
                       and c.issuer == "ddp"]
            assert buckets, (rank, step.step)
            assert step.comm_ops >= len(buckets)


def test_the_launching_process_records_its_launch_and_is_no_rank(runs):
    run_dir, _ = tutorial(runs)
    launched, end = launcher_records(run_dir)
    assert (launched.launcher, launched.processes, launched.start_method, launched.script) == (
        "torch.multiprocessing", 2, "spawn", SCRIPT)
    assert (end.status, end.exit_code, end.exception) == ("ok", 0, None)
    starts = [h.of_kind(h.manifest(run_dir, rank), schema.RunStart)[0] for rank in (0, 1)]
    assert launched.pid not in {start.pid for start in starts}
    assert sorted(p.name for p in run_dir.glob("rank*.manifest.jsonl")) == [
        "rank0.manifest.jsonl", "rank1.manifest.jsonl"]


def test_the_losses_are_those_of_the_untraced_run_bit_for_bit(runs):
    tutorial(runs)
    assert runs["untraced"].returncode == 1
    for rank in (0, 1):
        expected = losses(runs.root / "untraced", rank)
        assert len(expected) == STEPS
        assert losses(runs.root / "tutorial", rank) == expected


def test_the_late_rank_is_named_and_rank_0_waits_its_delay_at_every_step(runs):
    run_dir, _ = tutorial(runs)
    run = open_run(run_dir, use_cache=False)
    assert run.cross_rank is not None, run.report.unavailable
    document = run.document()["cross_rank"]
    assert [s["rank"] for s in document["stragglers"]][:1] == [1]
    waits = run.cross_rank.waits
    victim = waits[waits["rank"] == 0]["wait_for_peers_ms"]
    assert len(victim) >= STEPS - 3
    assert np.median(victim) == pytest.approx(STRAGGLE_MS, rel=0.3)
    assert np.median(waits[waits["rank"] == 1]["wait_for_peers_ms"]) < 0.3 * STRAGGLE_MS


def test_a_crashing_rank_gives_the_untraced_error_and_exit_code(runs):
    root, untraced, traced = runs.root, runs["untraced"], runs["crash"]
    assert traced.returncode == untraced.returncode == 1
    assert ERROR in untraced.stderr
    assert parents_error(traced.stderr) == parents_error(untraced.stderr)
    assert "tracer" not in parents_error(traced.stderr).replace(str(REPO), "")
    run_dir = h.only_run_dir(root / "crash" / "traces")
    failed, ok = h.run_end(run_dir, 1), h.run_end(run_dir, 0)
    assert (failed.status, failed.exit_code, failed.exception, failed.steps) == (
        "failed", 1, ERROR, STEPS)
    assert (ok.status, ok.steps) == ("ok", STEPS)
    (launched,) = h.of_kind(launcher_records(run_dir), schema.Launch)
    assert (launched.start_method, launched.processes) == ("fork", 2)
    end = launcher_records(run_dir)[-1]
    assert (end.status, end.exit_code) == ("failed", 1)
    assert end.exception.startswith("ProcessRaisedException")
    for rank in (0, 1):
        assert losses(root / "crash", rank) == losses(root / "untraced", rank)


def test_a_hung_rank_is_named_by_the_stop_diagnosis_after_sigterm(tmp_path):
    """Ranks started as multiprocessing.Process (forkserver); rank 1 sleeps for ever before step
    4, rank 0 waits in DDP's all-reduce; SIGTERM to the launching process, as `timeout` sends
    it, is passed on to both ranks, which record where they were."""
    out = tmp_path / "traces"
    started = start(SCRIPT, "--steps", "8", "--hang", "1:4", "--launcher", "process",
                    "--start-method", "forkserver", tracer=["--out", out])
    started.wait_for_line("rank 1 hangs at step 4")
    time.sleep(1.0)  # rank 0 reaches the all-reduce rank 1 never issues
    started.popen.send_signal(signal.SIGTERM)
    _, stderr = started.communicate(timeout=60)
    assert started.popen.returncode == -signal.SIGTERM, stderr[-3000:]
    run_dir = h.only_run_dir(out)
    for rank in (0, 1):
        end = h.run_end(run_dir, rank)
        assert (end.status, end.exit_code, end.steps) == ("interrupted", -15, 4)
        (start_record,) = h.of_kind(h.manifest(run_dir, rank), schema.RunStart)
        assert start_record.launched_by == "multiprocessing.Process"
    records = launcher_records(run_dir)
    assert [(r.launcher, r.processes, r.start_method) for r in records[:-1]] == [
        ("multiprocessing.Process", 1, "forkserver")] * 2
    assert (records[-1].status, records[-1].exit_code) == ("interrupted", -15)
    found = open_run(run_dir, use_cache=False).document()["stop_diagnosis"]
    group = found["groups"][0]
    assert (group["kind"], group["op"], group["missing_ranks"], group["issued_ranks"]) == (
        "missing", "all_reduce", [1], [0])
    hung = found["ranks"][1]["frames"][0]
    assert (Path(hung["file"]).name, hung["function"]) == ("spawn_ddp.py", "demo_basic")
    launcher_lines = [line for line in stderr.splitlines()
                      if line.startswith("ranktrace: launcher")]
    assert launcher_lines == [f"ranktrace: launcher interrupted started 2 process(es) "
                              f"(multiprocessing.Process, start method forkserver) -> {run_dir}"]


def test_ranks_elastic_launch_starts_from_a_function_are_traced_as_torchruns(tmp_path):
    out = tmp_path / "traces"
    result = launch(SCRIPT, "--steps", "3", "--launcher", "elastic", tracer=["--out", out],
                    timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = h.only_run_dir(out)
    for rank in (0, 1):
        (start_record,) = h.of_kind(h.manifest(run_dir, rank), schema.RunStart)
        assert (start_record.rank, start_record.world_size, start_record.launched_by) == (
            rank, 2, "torch.distributed.launcher")
        assert h.run_end(run_dir, rank).steps == 3
    launched, end = launcher_records(run_dir)
    assert (launched.launcher, launched.processes, end.status) == (
        "torch.distributed.launcher", 2, "ok")


@pytest.mark.compiled
def test_the_compiled_tutorial_trains_bit_identically(tmp_path):
    env = torchrun_env(TORCHINDUCTOR_CACHE_DIR=tmp_path / "kernels",
                       TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
                       TORCHINDUCTOR_COMPILE_THREADS="1")
    for name, tracer in (("untraced", None), ("traced", ["--out", tmp_path / "traces"])):
        (tmp_path / name).mkdir()
        result = launch(SCRIPT, "--steps", "10", "--compile", "--losses",
                        tmp_path / name / "losses", tracer=tracer, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    run_dir = h.only_run_dir(tmp_path / "traces")
    for rank in (0, 1):
        expected = losses(tmp_path / "untraced", rank)
        assert len(expected) == 10 and losses(tmp_path / "traced", rank) == expected
        assert h.run_end(run_dir, rank).steps == 10
