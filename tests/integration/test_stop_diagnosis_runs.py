"""The stop diagnosis of real 2-rank gloo runs with an injected hang, mismatch or crash, a clean
run that gets none, and SIGUSR1 to a training process: its stacks, and training unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis import open_run
from analysis.report import text_report
from helpers import tracer_files as h
from helpers.launch import DDP, REPO, launch
from tracer import schema

TRACED = ["--no-profiler", "--no-sampler", "--no-scalars", "--ddp-bucket-hook"]
# ddp.py's ops on group 0 with --ddp-bucket-hook: DDP's parameter broadcast (#0), one bucket in
# step 1 (DDP rebuilds its buckets after it), two in step 2: step 3 starts at #4.
STEP_3_POSITION = 4


# Native ops (torch's Flight Recorder) on group 0 in the default run: DDP's shape check and
# start-up broadcast (#0, #1; its parameter broadcast #2 is the hooks'), one bucket in step 1
# (#3), the bucket rebuild (#4, #5), two buckets a step from step 2 (#6, #7): step 3's first
# bucket is #8.
NATIVE_STEP_3_POSITION = 8
# DDP's ops no hook sees (its shape check, a start-up broadcast, the bucket rebuild's two),
# which --ddp-bucket-hook leaves to the Flight Recorder.
DDP_NATIVE_OPS_WITH_BUCKET_HOOK = 4


# The process group's timeout of a run with a rank that hangs: the other ranks wait this long
# in the op it never issues. It must outlast the ranks' start-up skew (DDP's first broadcast
# waits for every rank's construction), a few seconds at most with 4 ranks on 2 cores.
HANG_TIMEOUT_S = "5"
FOUR_RANK_HANG_TIMEOUT_S = "7"


def fault_run(tmp_path, fault: list[str], traced=TRACED, timeout_s="10") -> tuple[object, Path]:
    out = tmp_path / "traces"
    result = launch(DDP, "--steps", "4", "--pg-timeout-s", timeout_s, *fault,
                    tracer=["--out", out, *traced], nproc=2, timeout=240)
    return result, h.only_run_dir(out)


def diagnosis(run_dir: Path) -> tuple[dict, str]:
    run = open_run(str(run_dir), use_cache=False)
    return run.document()["stop_diagnosis"], text_report.text_report(run.report)


def script_line(path: str, code: str) -> int:
    source = (REPO / path).read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if line.strip() == code)


def sleep_line() -> int:
    return script_line("workloads/common.py", "time.sleep(1)")


def test_a_hung_rank_is_named_with_the_op_it_never_issued_and_its_sleep(tmp_path):
    result, run_dir = fault_run(tmp_path, ["--hang", "1:3"], timeout_s=HANG_TIMEOUT_S)
    assert result.returncode != 0
    # rank 0: the group's timeout; gloo words it by the side that notices first
    assert re.search(r"Timed out|timeout", h.run_end(run_dir, 0).exception)
    found, text = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["pg"], group["kind"], group["op"], group["position"]) == (
        "0", "missing", "all_reduce", STEP_3_POSITION)
    assert group["missing_ranks"] == [1] and group["issued_ranks"] == [0]
    assert group["last_completed_position"] == STEP_3_POSITION - 1
    hung = found["ranks"][1]
    assert hung["frames"][0]["file"].endswith("workloads/common.py")
    assert (hung["frames"][0]["line"], hung["frames"][0]["function"]) == (
        sleep_line(), "before_forward")
    # rank 0 waited in backward: DDP's reducer raised the timeout, no wrapper of ours saw it
    waiting = found["ranks"][0]["frames"]
    assert waiting[-1]["file"].endswith("workloads/ddp.py")
    assert (waiting[-1]["line"], waiting[-1]["function"]) == (script_line("workloads/ddp.py",
                                                               "loss.backward()"), "train")
    assert "rank 0 (failed) no stack dump" not in text
    assert text.index("Stop diagnosis") < text.index("Collectives")
    assert f"rank 1 never issued all_reduce #{STEP_3_POSITION} on group 0" in text
    assert (f"was in before_forward at workloads/common.py:{sleep_line()} (`time.sleep(1)`)"
            in text)


def test_with_default_options_the_bucket_all_reduce_a_rank_waited_in_is_named(tmp_path):
    # No comm hook: DDP's C++ reducer issues the buckets, seen in torch's Flight Recorder.
    default = [o for o in TRACED if o != "--ddp-bucket-hook"]
    result, run_dir = fault_run(tmp_path, ["--hang", "1:3"], traced=default,
                                timeout_s=HANG_TIMEOUT_S)
    assert result.returncode != 0
    found, text = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["pg"], group["space"], group["kind"], group["op"], group["position"]) == (
        "0", "native", "missing", "all_reduce", NATIVE_STEP_3_POSITION)
    assert group["missing_ranks"] == [1] and group["issued_ranks"] == [0]
    assert group["last_completed_position"] == NATIVE_STEP_3_POSITION - 1
    assert len(found["groups"]) == 1  # the hooks' own ops (the parameter broadcast) all ended
    assert (f"rank 1 never issued all_reduce #{NATIVE_STEP_3_POSITION} on group 0 (native: "
            in text)
    assert "the stop came outside them" not in text


def test_a_mismatched_all_reduce_is_named_with_each_ranks_size(tmp_path):
    result, run_dir = fault_run(tmp_path, ["--mismatch", "1:3"])
    assert result.returncode != 0
    found, _ = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["kind"], group["op"], group["position"], group["issued_ranks"]) == (
        "mismatch", "all_reduce", STEP_3_POSITION, [0, 1])
    assert group["signatures"] == ("all_reduce 4 B float32 on rank 0; all_reduce 4.1 kB "
                                   "float32 on rank 1")


def test_a_crashed_rank_is_named_dead_and_missing(tmp_path):
    result, run_dir = fault_run(tmp_path, ["--crash", "1:3"])
    assert result.returncode != 0
    found, text = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["kind"], group["op"], group["position"]) == (
        "missing", "all_reduce", STEP_3_POSITION)
    assert group["missing_ranks"] == [1] and group["dead_ranks"] == [1]
    assert found["ranks"][1]["status"] == schema.STATUS_NO_END
    assert "rank 1 died (no run_end)" in text


@pytest.mark.parametrize("issue_records", [True, False])
def test_a_clean_run_gets_no_stop_diagnosis(tmp_path, issue_records):
    out = tmp_path / "traces"
    options = [] if issue_records else ["--no-issue-records"]
    result = launch(DDP, "--steps", "2", tracer=["--out", out, *TRACED, *options], nproc=2,
                    timeout=240)
    assert result.returncode == 0, result.stderr
    run_dir = h.only_run_dir(out)
    found, text = diagnosis(run_dir)
    assert found is None and "Stop diagnosis" not in text
    # --no-issue-records: no issue file; the ops are still in the completion records
    issued = [run_dir / schema.ISSUED_FILE.format(rank=r) for r in (0, 1)]
    assert [p.is_file() for p in issued] == [issue_records] * 2
    completed = [json.loads(line) for line in
                 (run_dir / schema.COMMS_FILE.format(rank=0)).read_text().splitlines()]
    hooked = [r for r in completed if r["source"] != schema.NATIVE_SOURCE]
    assert len(hooked) == 4  # the parameter broadcast, one bucket in step 1, two in step 2
    assert len(completed) == 4 + DDP_NATIVE_OPS_WITH_BUCKET_HOOK
    if issue_records:
        assert len(issued[0].read_text().splitlines()) == 4 + DDP_NATIVE_OPS_WITH_BUCKET_HOOK


def test_sigusr1_writes_the_stacks_and_training_ends_with_the_same_loss(tmp_path):
    script = "tests/scripts/stop_sigusr1_train.py"
    out = tmp_path / "traces"
    untraced = launch(script, "--steps", "6")
    assert untraced.returncode == 0, untraced.stderr
    traced = launch(script, "--steps", "6", "--signal-at", "3", "--wait-for",
                    str(out / "*" / schema.STACKS_FILE.format(rank=0)),
                    tracer=["--out", out, "--no-profiler", "--no-sampler", "--no-scalars"])
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == untraced.stdout and untraced.stdout.strip()
    run_dir = h.only_run_dir(out)
    assert h.run_end(run_dir, 0).status == "ok"
    lines = (run_dir / schema.STACKS_FILE.format(rank=0)).read_text().splitlines()
    dump = json.loads(lines[0])
    assert len(lines) == 1 and dump["reason"] == "sigusr1" and dump["pending"] == []
    main = next(t for t in dump["threads"] if t["main"])
    # the script's wait loop (in glob or time.sleep), below runpy's frames
    assert any(f["file"].endswith("stop_sigusr1_train.py") and f["function"] == "<module>"
               for f in main["frames"])
    issued = (run_dir / schema.ISSUED_FILE.format(rank=0)).read_text().splitlines()
    assert [json.loads(line)["position"] for line in issued] == list(range(6))


def four_rank_fault_run(tmp_path, fault: list[str], timeout_s="10") -> tuple[object, Path]:
    out = tmp_path / "traces"
    # One bucket a step (tiny model): DDP's broadcast is #0, steps 1 and 2 are #1 and #2.
    result = launch(DDP, "--steps", "4", "--hidden", "32", "--layers", "1", "--batch-size", "8",
                    "--pg-timeout-s", timeout_s, *fault, tracer=["--out", out, *TRACED], nproc=4,
                    timeout=240)
    return result, h.only_run_dir(out)


def test_four_ranks_one_hung_the_others_waiting_in_the_op_it_never_issued(tmp_path):
    result, run_dir = four_rank_fault_run(tmp_path, ["--hang", "2:3"],
                                          timeout_s=FOUR_RANK_HANG_TIMEOUT_S)
    assert result.returncode != 0
    found, text = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["pg"], group["kind"], group["op"], group["position"]) == (
        "0", "missing", "all_reduce", 3)
    assert group["missing_ranks"] == [2] and group["issued_ranks"] == [0, 1, 3]
    assert group["last_completed_position"] == 2 and group["dead_ranks"] == []
    hung = found["ranks"][2]["frames"][0]
    assert hung["file"].endswith("workloads/common.py")
    assert (hung["line"], hung["function"]) == (sleep_line(), "before_forward")
    for waiting in (0, 1, 3):
        assert found["ranks"][waiting]["frames"][-1]["line"] == script_line(
            "workloads/ddp.py", "loss.backward()")
    assert "rank 2 never issued all_reduce #3 on group 0" in text
    assert "which ranks 0-1, 3 waited in from" in text


def test_four_ranks_one_mismatched_all_reduce_names_the_odd_rank(tmp_path):
    # --mismatch: every rank all-reduces one tensor at the start of step 3, rank 3's larger
    result, run_dir = four_rank_fault_run(tmp_path, ["--mismatch", "3:3"])
    assert result.returncode != 0
    found, text = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["pg"], group["kind"], group["op"], group["position"]) == (
        "0", "mismatch", "all_reduce", 3)
    assert group["issued_ranks"] == [0, 1, 2, 3] and group["odd_ranks"] == [3]
    assert group["last_completed_position"] == 2
    assert group["signatures"] == ("all_reduce 4 B float32 on ranks 0-2; all_reduce 4.1 kB "
                                   "float32 on rank 3")
    assert "rank 3 issued all_reduce #3 on group 0" in text


def test_four_ranks_one_crashed_is_named_dead_and_missing(tmp_path):
    result, run_dir = four_rank_fault_run(tmp_path, ["--crash", "1:3"])
    assert result.returncode != 0
    found, text = diagnosis(run_dir)
    group = found["groups"][0]
    assert (group["pg"], group["kind"], group["op"], group["position"]) == (
        "0", "missing", "all_reduce", 3)
    assert group["missing_ranks"] == [1] and group["dead_ranks"] == [1]
    assert group["issued_ranks"] == [0, 2, 3]
    assert found["ranks"][1]["status"] == schema.STATUS_NO_END
    assert "rank 1 died (no run_end)" in text
