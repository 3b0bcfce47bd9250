"""The tracer under faults: bad --out, reruns and restarts, script errors, SIGTERM, full disks,
killed ranks. In every case training is unaffected and what was recorded stays readable."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2

from helpers import tracer_files as h
from helpers.launch import TINY, launch, popen, torchrun_env
from tracer import schema
from tracer.parts import tensorboard_scalars as scalars_mod
from tracer.parts.buffered_file import RecordBudget

FAST = ["--no-profiler", "--no-sampler", "--no-comms"]


# ---- before training ------------------------------------------------------------------------
@pytest.mark.parametrize("name,reason", [
    ("a-file", "--out '{out}' is not a folder"),
    ("a-file/sub", "cannot create --out '{out}': Not a directory"),
])
def test_bad_out_fails_before_the_script_runs(tmp_path, name, reason):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / name
    result = launch(TINY, "--losses", tmp_path / "ran", tracer=["--out", out])
    assert result.returncode == 1
    assert reason.format(out=out) in result.stderr
    assert "the script was not run" in result.stderr
    assert result.stdout == "" and not (tmp_path / "ran").exists()


def test_a_missing_out_is_created_with_its_parents(tmp_path):
    out = tmp_path / "new" / "traces"
    result = launch(TINY, "--steps", "2", tracer=["--out", out] + FAST)
    assert result.returncode == 0, result.stderr
    assert h.run_end(h.only_run_dir(out), 0).steps == 2


_SCRIPT_HELP = "usage: tiny_train.py"


_BAD_OPTION = "ranktrace: error: unrecognized arguments: --no-such-option"


@pytest.mark.parametrize("tracer_args,script,script_args,exit_code,says", [
    (["--help"], TINY, [], 0, "--skip-first"),
    (["--no-such-option"], TINY, [], 2, _BAD_OPTION),
    ([], "no/such/script.py", [], 2, "can't open file"),
    ([], "tests/scripts", [], 1, "can't find '__main__' module in"),
    ([], TINY, ["--help"], 0, _SCRIPT_HELP),
    ([], TINY, ["--no-such-flag"], 2, "tiny_train.py: error: unrecognized arguments"),
    ([], "syntax_error.py", [], 1, "SyntaxError"),
], ids=["tracer-help", "tracer-bad-option", "missing-script", "folder-without-main",
        "script-help", "script-bad-option", "syntax-error"])
def test_failed_starts_leave_no_run_folder(tmp_path, tracer_args, script, script_args,
                                           exit_code, says):
    if script == "syntax_error.py":
        script = str(tmp_path / script)
        Path(script).write_text("def broken(:\n")
    out = tmp_path / "traces"
    out.mkdir()
    result = launch(script, *script_args, tracer=["--out", out, "--no-profiler", *tracer_args])
    assert result.returncode == exit_code, result.stderr
    assert says in result.stdout + result.stderr
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("kind", ["folder", "zip"])
def test_a_folder_or_zip_without_main_fails_as_python_does(tmp_path, kind):
    target = tmp_path / "app"
    if kind == "folder":
        target.mkdir()
        (target / "helper.py").write_text("")
    else:
        target = tmp_path / "app.zip"
        with zipfile.ZipFile(target, "w") as archive:
            archive.writestr("helper.py", "")
    out = tmp_path / "traces"
    bare = launch(str(target))
    traced = launch(str(target), tracer=["--out", out])
    assert bare.returncode == traced.returncode == 1
    assert bare.stderr == f"{sys.executable}: can't find '__main__' module in '{target}'\n"
    assert traced.stderr == f"ranktrace: error: can't find '__main__' module in '{target}'\n"
    assert not out.exists() or list(out.iterdir()) == []


def _make_unwritable(folder) -> callable:
    """Make `folder` unwritable even for root (immutable attribute) or by mode bits; returns
    the undo, or None where neither works here."""
    if os.geteuid() != 0:
        folder.chmod(0o500)
        return lambda: folder.chmod(0o700)
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)
    return None


def test_unwritable_out_fails_before_the_script_runs(tmp_path):
    out = tmp_path / "read-only"
    out.mkdir()
    undo = _make_unwritable(out)
    if undo is None:
        pytest.skip("root without chattr: no way to make a folder unwritable here")
    try:
        result = launch(TINY, "--losses", tmp_path / "ran", tracer=["--out", out])
    finally:
        undo()
    assert result.returncode == 1
    assert re.search(rf"cannot create run folder '{re.escape(str(out))}/[^']+': "
                     r"(Permission denied|Operation not permitted)", result.stderr), result.stderr
    assert "the script was not run" in result.stderr
    assert not (tmp_path / "ran").exists() and list(out.iterdir()) == []


def test_max_record_mb_caps_the_record_files_and_training_goes_on(tmp_path):
    cap = 20_000  # bytes: about 30 steps' records (700 bytes each), with the start-up's samples
    # 30 ms a step: each 0.2 s pass of the step-end worker writes a handful of steps.
    args = ["--steps", "100", "--all-reduce-loss"]
    # The untraced run gives the losses only: a sleep changes none of them (3 s less waited).
    bare = launch(TINY, *args, "--losses", tmp_path / "bare")
    traced = launch(TINY, *args, "--step-sleep", "0.03", "--losses", tmp_path / "traced",
                    tracer=["--out", tmp_path / "traces", "--max-record-mb", cap / 1e6,
                            "--sample-hz", "1", "--active", "101", "--max-window-steps", "101"])
    assert bare.returncode == traced.returncode == 0, traced.stderr
    assert h.losses(tmp_path / "traced") == h.losses(tmp_path / "bare")
    run_dir = h.only_run_dir(tmp_path / "traces")
    end = h.run_end(run_dir, 0)
    assert (end.steps, end.comm_ops, end.windows) == (100, 100, 1)
    header = len(scalars_mod._frame(event_pb2.Event(
        wall_time=1.0, file_version="brain.Event:2").SerializeToString()))
    capped_files = [run_dir / pattern.format(rank=0) for pattern in
                    (schema.STEPS_FILE, schema.COMMS_FILE, schema.ISSUED_FILE,
                     schema.SAMPLES_FILE)]
    (events,) = run_dir.glob("events.out.tfevents.*")
    total = sum(p.stat().st_size for p in capped_files) + events.stat().st_size - header
    # Records of steps before the cap that were on their way (one pass of the worker: a few
    # steps of about 700 bytes, up to about 30 when a loaded machine holds the worker back a
    # second) still get in; uncapped, the files would hold about 70 kB.
    assert cap - 1000 < total < cap + 22000
    cap_step = end.record_cap_step
    assert cap_step is not None and 0 < cap_step < 100
    capped = [line for line in traced.stderr.splitlines() if "--max-record-mb" in line]
    assert capped == [f"ranktrace: rank0 records: --max-record-mb 0.02 reached at step "
                      f"{cap_step}: step, comm and sample records and scalars stop there "
                      f"(Kineto traces and the manifest go on)"]
    # Every step before the cap has its step record and its comm op; the cap step may be partly
    # written. Comm records are written before the step records of the same pass, so those of
    # a few later steps may be there too.
    recorded = [s.step for s in h.steps(run_dir, 0)]
    assert recorded in (list(range(cap_step)), list(range(cap_step + 1)))
    comm_steps = [c.step for c in h.read_jsonl(capped_files[1], schema.CommRecord)]
    assert comm_steps == list(range(len(comm_steps))) and cap_step <= len(comm_steps) < 100
    assert "ranktrace: rank0 profiler: --active 101 keeps every event of 101 steps" in traced.stderr


def test_record_budget_stops_at_the_step_of_the_first_record_that_does_not_fit():
    reached = []
    budget = RecordBudget(100, reached.append)
    assert [budget.charge(60, 0), budget.charge(40, 1), budget.charge(1, 2)] == [True, True, False]
    # Step 1's late records still get in, so that it stays complete; step 2 and later do not.
    assert [budget.charge(30, 1), budget.charge(0, 2), budget.charge(5, 3)] == [True, False, False]
    assert (budget.used_bytes, budget.cap_step, reached) == (130, 2, [2])


# ---- reruns and restarts --------------------------------------------------------------------
def test_a_rerun_never_overwrites_and_a_restart_gets_an_attempt_folder(tmp_path):
    first = launch(TINY, "--steps", "2", tracer=["--out", tmp_path, "--run-name", "exp"] + FAST)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in (tmp_path / "exp").iterdir()}
    again = launch(TINY, "--steps", "3", tracer=["--out", tmp_path, "--run-name", "exp"] + FAST)
    restart = launch(TINY, "--steps", "1", tracer=["--out", tmp_path, "--run-name", "exp"] + FAST,
                     env=torchrun_env(TORCHELASTIC_RESTART_COUNT="1"))
    assert again.returncode == 0 and restart.returncode == 0
    assert [p.name for p in h.run_dirs(tmp_path)] == ["exp", "exp-1", "exp-attempt1"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "exp").iterdir()} == before
    assert h.run_end(tmp_path / "exp-1", 0).steps == 3
    start, = h.of_kind(h.manifest(tmp_path / "exp-attempt1", 0), schema.RunStart)
    assert (start.attempt, start.run_name) == (1, "exp-attempt1")


def test_torchrun_restart_writes_each_attempt_into_its_own_folder(tmp_path):
    # Attempt 0 fails on purpose and torchrun restarts both ranks once. No process group: torch
    # 2.13's gloo fails to reconnect in a restarted worker group, traced or not.
    result = launch(TINY, "--no-process-group", "--steps", "3", "--fail-in-first-attempt",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler"], nproc=2,
                    torchrun=["--max-restarts", "1"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    dirs = h.run_dirs(tmp_path)
    assert len(dirs) == 2 and dirs[1].name == dirs[0].name + "-attempt1"
    for attempt, run_dir in enumerate(dirs):
        for rank in (0, 1):
            start, = h.of_kind(h.manifest(run_dir, rank), schema.RunStart)
            assert (start.attempt, start.rank, start.run_name) == (attempt, rank, run_dir.name)
    assert [(h.run_end(dirs[1], r).status, h.run_end(dirs[1], r).steps) for r in (0, 1)] == [
        ("ok", 3), ("ok", 3)]
    # Both ranks raise at step 1 of attempt 0; the first to fail makes torchrun stop the other,
    # which may still be on its way there: it ends "interrupted".
    first = [h.run_end(dirs[0], r) for r in (0, 1)]
    assert all(end.steps == 1 for end in first)
    assert {end.status for end in first} <= {"failed", "interrupted"}
    failed = [end for end in first if end.status == "failed"]
    assert failed and all(end.exception == "RuntimeError: failing the first attempt on purpose"
                          for end in failed)


# ---- the script fails -----------------------------------------------------------------------
def test_exception_keeps_traceback_and_exit_code_and_saves_the_open_window(tmp_path):
    args = ["--steps", "6", "--fail-at", "4"]
    bare = launch(TINY, *args)
    traced = launch(TINY, *args, tracer=["--out", tmp_path, "--skip-first", "0", "--wait", "0",
                                         "--warmup", "1", "--active", "50",
                                         "--max-window-steps", "50"])
    assert bare.returncode == traced.returncode == 1
    assert "RuntimeError: failing on purpose at step 4" in bare.stderr
    assert h.script_stderr(traced.stderr) == bare.stderr
    assert traced.stdout == bare.stdout
    run_dir = h.only_run_dir(tmp_path)
    end = h.run_end(run_dir, 0)
    assert (end.status, end.exit_code, end.steps) == ("failed", 1, 4)
    assert end.exception == "RuntimeError: failing on purpose at step 4"
    # The window was still open when the script failed: it is written, not lost.
    (trace,) = h.traces(run_dir, 0)
    names = {e.get("name") for e in h.load_trace(trace)["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#3"} <= names
    assert h.temp_files(run_dir) == []
    assert h.summaries(traced.stderr)[0]["status"] == "failed"


FAILING_CALLS = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def broken_hook(state, bucket):
    raise RuntimeError("the user's hook fails")


if sys.argv[1] == "collective":
    dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX)
elif sys.argv[1] == "chained":
    dist.destroy_process_group()
    try:
        dist.all_reduce(torch.ones(2))
    except ValueError as exc:
        raise RuntimeError("no group left") from exc
else:
    model = DDP(torch.nn.Linear(4, 4))
    model.register_comm_hook(None, broken_hook)
    model(torch.ones(2, 4)).sum().backward()
"""


@pytest.mark.parametrize("failing", ["collective", "chained", "ddp_hook"])
def test_traceback_through_the_tracers_wrappers_is_the_untraced_one(tmp_path, failing):
    """A direct dist.* call and a user's DDP comm hook run inside the tracer's wrappers; their
    frames are left out of the printed traceback, which is then byte for byte the untraced one
    (the script's path is the same in both runs)."""
    script = tmp_path / "failing_calls.py"
    script.write_text(FAILING_CALLS)
    bare = launch(script, failing)
    traced = launch(script, failing,
                    tracer=["--out", tmp_path / "out", "--no-profiler", "--no-sampler"])
    assert bare.returncode == traced.returncode == 1
    assert "Traceback" in bare.stderr and "tracer" not in bare.stderr
    assert h.script_stderr(traced.stderr) == bare.stderr
    assert h.summaries(traced.stderr)[0]["status"] == "failed"


def test_sys_exit_code_comes_through_and_counts_as_failed(tmp_path):
    result = launch(TINY, "--steps", "2", "--exit-code", "3", tracer=["--out", tmp_path] + FAST)
    assert result.returncode == 3
    end = h.run_end(h.only_run_dir(tmp_path), 0)
    assert (end.status, end.exit_code, end.steps, end.exception) == ("failed", 3, 2, None)


# ---- SIGTERM --------------------------------------------------------------------------------
def _wait_for(process, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if text in line:
            return
        if not line and process.poll() is not None:
            raise AssertionError(f"exited before {text!r}: {process.stderr.read()}")
    raise AssertionError(f"no {text!r} within {timeout} s")


def _terminate(process) -> float:
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    return time.monotonic() - sent


def test_sigterm_mid_window_flushes_writes_the_window_and_dies_by_sigterm(tmp_path):
    process = popen(TINY, "--steps", "100000",
                    tracer=["--out", tmp_path, "--run-name", "t", "--no-sampler", "--skip-first",
                            "0", "--wait", "0", "--active", "100000",
                            "--max-window-steps", "100000"])
    _wait_for(process, "step 20 ")
    elapsed = _terminate(process)
    assert process.returncode == -signal.SIGTERM and elapsed < 5
    end = h.run_end(tmp_path / "t", 0)
    assert (end.status, end.exit_code, end.windows) == ("interrupted", -15, 1)
    assert end.steps >= 21 and len(h.steps(tmp_path / "t", 0)) == end.steps
    (trace,) = h.traces(tmp_path / "t", 0)
    assert "ProfilerStep#20" in {e.get("name") for e in h.load_trace(trace)["traceEvents"]}
    assert h.temp_files(tmp_path / "t") == []
    assert "ranktrace: rank0 interrupted" in process.stderr.read()


def test_sigterm_while_blocked_in_a_c_call_still_ends_within_5_seconds(tmp_path):
    process = popen(TINY, "--steps", "8", "--block-at", "3",
                    tracer=["--out", tmp_path, "--run-name", "t", "--no-sampler", "--skip-first",
                            "0", "--wait", "0", "--active", "100", "--max-window-steps", "100"])
    _wait_for(process, "blocking at step 3")
    time.sleep(0.3)  # into the store's C++ wait, where no Python signal handler can run
    elapsed = _terminate(process)
    assert process.returncode == -signal.SIGTERM and elapsed < 5
    records = h.manifest(tmp_path / "t", 0)
    end = records[-1]
    assert isinstance(end, schema.RunEnd)
    assert (end.status, end.steps) == ("interrupted", 3)
    lost, = h.of_kind(records, schema.TracerError)
    assert lost.part == "profiler" and "blocked" in lost.message
    assert [s.step for s in h.steps(tmp_path / "t", 0)] == [0, 1, 2]
    assert h.temp_files(tmp_path / "t") == []


def test_sigterm_to_torchrun_reaches_every_rank_and_each_finishes_its_files(tmp_path):
    process = popen(TINY, "--ddp", "--steps", "100000",
                    tracer=["--out", tmp_path, "--run-name", "t", "--skip-first", "2"], nproc=2)
    _wait_for(process, "step 20 ")
    elapsed = _terminate(process)
    assert process.returncode != 0 and elapsed < 5
    for rank in (0, 1):
        end = h.run_end(tmp_path / "t", rank)
        assert (end.status, end.exit_code, end.windows) == ("interrupted", -15, 1)
        assert len(h.steps(tmp_path / "t", rank)) == end.steps >= 21
    assert h.temp_files(tmp_path / "t") == []


def test_the_scripts_own_sigterm_handler_still_runs(tmp_path):
    marker = tmp_path / "handled"
    process = popen(TINY, "--steps", "100000", "--sigterm-handler", marker,
                    tracer=["--out", tmp_path, "--run-name", "t"] + FAST)
    _wait_for(process, "step 5 ")
    _terminate(process)
    assert process.returncode == 7 and marker.read_text() == "handled\n"
    end = h.run_end(tmp_path / "t", 0)
    assert (end.status, end.exit_code) == ("interrupted", 7)


# ---- write errors ---------------------------------------------------------------------------
def test_disk_full_on_the_steps_file_switches_only_it_off(tmp_path):
    args = ["--steps", "10", "--losses"]
    launch(TINY, *args, tmp_path / "bare")
    (tmp_path / "out").mkdir()
    traced = launch(TINY, *args, tmp_path / "traced", "--break-steps-file-at", "6",
                    tracer=["--out", tmp_path / "out", "--no-profiler"])
    assert traced.returncode == 0, traced.stderr
    assert h.losses(tmp_path / "traced") == h.losses(tmp_path / "bare")
    tracer_lines = [
        line for line in traced.stderr.splitlines() if "No space left on device" in line
    ]
    assert len(tracer_lines) == 1 and "steps" in tracer_lines[0]
    run_dir = h.only_run_dir(tmp_path / "out")
    records = h.manifest(run_dir, 0)
    error, = [e for e in h.of_kind(records, schema.TracerError) if e.part != "sampler"]
    assert error.part == "steps" and "No space left on device" in error.message
    end = records[-1]
    assert (end.status, end.steps) == ("ok", 10)
    assert end.errors == len(h.of_kind(records, schema.TracerError))
    # Records flushed before the failure stay in the .tmp file; nothing after it was written.
    recorded = h.steps(run_dir, 0)
    assert [s.step for s in recorded] == list(range(len(recorded))) and len(recorded) <= 6


def test_trace_write_failure_switches_the_profiler_off_and_training_goes_on(tmp_path):
    limit = 40_000  # bytes: the raw trace is larger, every other file is smaller

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = launch(TINY, "--steps", "8", tracer=["--out", tmp_path, "--no-sampler",
                                                  "--skip-first", "0", "--wait", "0",
                                                  "--active", "4"], preexec_fn=small_files)
    assert result.returncode == 0, result.stderr
    assert "step 7 loss" in result.stdout
    run_dir = h.only_run_dir(tmp_path)
    assert h.traces(run_dir, 0) == [] and h.temp_files(run_dir) == []
    records = h.manifest(run_dir, 0)
    error, = [e for e in h.of_kind(records, schema.TracerError) if e.part != "comms"]
    assert error.part == "profiler" and "writing trace" in error.message
    assert [
        line for line in result.stderr.splitlines() if line.startswith("ranktrace: rank0 profiler")
    ] == [f"ranktrace: rank0 profiler: {error.message}"]
    assert (records[-1].status, records[-1].steps, records[-1].windows) == ("ok", 8, 0)


# ---- a rank is killed -----------------------------------------------------------------------
def test_a_killed_rank_leaves_the_other_ranks_files_intact_and_its_own_readable(tmp_path):
    result = launch(TINY, "--ddp", "--steps", "40", "--kill-rank", "1", "--kill-at", "12",
                    tracer=["--out", tmp_path, "--skip-first", "1", "--wait", "0"], nproc=2,
                    timeout=180)
    assert result.returncode != 0
    run_dir = h.only_run_dir(tmp_path)
    # Rank 0 saw its peer vanish and ended cleanly: finished files, a run_end.
    end = h.run_end(run_dir, 0)
    assert end.status in ("failed", "interrupted") and end.steps == 12
    assert not [n for n in h.temp_files(run_dir) if n.startswith("rank0.")]
    assert len(h.steps(run_dir, 0)) == 12
    # Rank 1 died without a word: no run_end, but its .tmp files parse and its trace is whole.
    records = h.manifest(run_dir, 1)
    assert isinstance(records[0], schema.RunStart) and not h.of_kind(records, schema.RunEnd)
    assert (run_dir / (schema.MANIFEST_FILE.format(rank=1) + schema.TEMP_SUFFIX)).exists()
    assert [s.step for s in h.steps(run_dir, 1)] == list(range(len(h.steps(run_dir, 1))))
    for rank in (0, 1):
        (trace,) = h.traces(run_dir, rank)
        assert "ProfilerStep#4" in {e.get("name") for e in h.load_trace(trace)["traceEvents"]}
