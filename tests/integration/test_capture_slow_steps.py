"""Windows opened when a step turns slow (--capture-slow-steps) and on demand (python -m
tracer.capture), on a 2-rank DDP run: every rank traces the same steps, the capture record names
the rank that slowed, and the training is what it is untraced.

The slow run: rank 1 spends 150 ms more from step 20 of 40 (tests/scripts/slow_from.py), after
its gradients are reduced, so that it slows a step before rank 0 (which then waits for it); the
window follows the slow step by the margin (at least 3 steps, 0.5 s at the pace after the slow
step), well inside the run.
One window at most (--max-captures 1): once the median has taken in the slow steps, a noisy step
of a shared machine may be twice it and open another. The run on demand waits at step 15 until
the test has asked for two steps.
"""

from __future__ import annotations

import json
import re

import pytest

from analysis import open_run
from analysis.ingest.capture_records import read_captures
from helpers.launch import launch, run_module, start
from helpers.run_copies import copy_run
from helpers.tracer_files import load_trace, read_jsonl, summaries
from tracer import schema

SCRIPT = "tests/scripts/slow_from.py"
# 15 ms of host work per step, and a factor of 3: a scheduling hiccup must stall a step by twice
# its time to trigger (on the 2-core CI machine, with another test session beside it, a step of
# rank 0 once took exactly twice its median at step 14, and its window was the run's one). The
# 150 ms delay triples a step even where a loaded machine has made the steps before it several
# times slower (190 ms against 40 would be 4.75), so rank 1 is judged slow at step 20 itself,
# and the profiled steps of the fixed window (slowed by the profiler and the load) stay well
# under the captured ones.
SLOW_MS = 150
FACTOR = "3"
SLOW = ("--steps", "40", "--step-ms", "15", "--slow-from", "20", "--slow-rank", "1",
        "--slow-ms", str(SLOW_MS))


def traced_steps(run_dir, rank: int) -> list[list[int]]:
    """The ProfilerStep numbers of each of a rank's traces, in time order."""
    found = []
    for path in sorted(run_dir.glob(f"rank{rank}.*.pt.trace.json.gz")):
        events = load_trace(path)["traceEvents"]
        found.append(sorted(int(e["name"].split("#")[1]) for e in events
                            if e.get("name", "").startswith("ProfilerStep#")))
    return sorted(found)


def captures(run_dir, rank: int) -> list[schema.CaptureRecord]:
    return [r for r in read_jsonl(run_dir / schema.MANIFEST_FILE.format(rank=rank),
                                  schema.ManifestRecord)
            if isinstance(r, schema.CaptureRecord)]


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capture-slow")
    # The busy loop changes no number: untraced, it is left out.
    untraced = launch(SCRIPT, *SLOW, "--slow-ms", "0", "--losses", folder / "untraced.txt",
                      nproc=2)
    assert untraced.returncode == 0, untraced.stderr[-3000:]
    traced = launch(SCRIPT, *SLOW, "--losses", folder / "traced.txt", nproc=2,
                    tracer=("--out", folder / "traces", "--run-name", "slow",
                            "--capture-slow-steps", FACTOR, "--max-captures", "1"))
    assert traced.returncode == 0, traced.stderr[-3000:]
    return folder, traced


def test_a_slow_step_opens_a_window_at_the_same_later_steps_on_every_rank(slow_run):
    folder, traced = slow_run
    run_dir = folder / "traces" / "slow"
    records = {rank: captures(run_dir, rank) for rank in (0, 1)}
    assert len(records[0]) == len(records[1]) == 1, records
    first = records[0][0]
    assert [(r.trigger, r.first_step, r.steps, r.trigger_step, r.trigger_rank, r.missed)
            for r in records[1]] == [("slow_step", first.first_step, 3, 20, 1, False)]
    assert (first.trigger, first.trigger_rank, first.trigger_step) == ("slow_step", 1, 20)
    assert first.ratio >= float(FACTOR) and first.ratio == records[1][0].ratio
    window = list(range(first.first_step, first.first_step + 3))
    assert 20 < first.first_step and window[-1] < 40
    # The fixed window (steps 7-9) and the captured one, on both ranks.
    assert traced_steps(run_dir, 0) == traced_steps(run_dir, 1) == [[7, 8, 9], window]
    for rank in (0, 1):
        steps = read_jsonl(run_dir / schema.STEPS_FILE.format(rank=rank), schema.StepRecord)
        in_window = [s.step for s in steps if s.in_profiler_window]
        assert in_window == [6, 7, 8, 9, first.first_step - 1, *window]
    assert {r: int(s["windows"]) for r, s in summaries(traced.stderr).items()} == {0: 2, 1: 2}
    assert read_captures(run_dir) == ([{
        "trigger": "slow_step", "rank": 1, "step": 20, "ratio": first.ratio,
        "first_step": first.first_step, "steps": window, "ranks_with_window": [0, 1],
        "ranks_missed": []}], [])
    assert "ranktrace: rank" not in traced.stderr.replace("ranktrace: rank0 ok", "").replace(
        "ranktrace: rank1 ok", "")  # no tracer line but the summaries


def test_the_captured_window_against_the_default_one_shows_the_slow_steps(slow_run, tmp_path):
    folder, _ = slow_run
    run_dir = copy_run(folder / "traces" / "slow", tmp_path / "slow")  # analysis writes a cache
    (window,), _ = read_captures(run_dir)
    done = run_module("analysis.diff", run_dir, "--capture", "1", "--format", "json",
                      "--resamples", "200")
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    steps = f"{window['steps'][0]}-{window['steps'][-1]}"
    assert document["a"]["path"] == f"{run_dir}, steps 7-9 (the profiler's first fixed window)"
    assert document["b"]["path"] == (f"{run_dir}, steps {steps} (captured on a slow step: rank 1's "
                                     f"step 20, {window['ratio']:.2f}x its median)")
    change = document["verdict"]
    assert (change["steps_a"], change["steps_b"]) == (3, 3)
    # Rank 1's busy loop (and rank 0's wait for it) in every captured step: a wall-clock wait,
    # which load cannot shorten.
    assert change["median_b_ms"] > SLOW_MS
    assert change["median_b_ms"] - change["median_a_ms"] > SLOW_MS / 2
    assert change["change_pct"] > 100
    # A capture the run does not have: one line naming the run and how many it has.
    missing = run_module("analysis.diff", run_dir, "--capture", "2")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"ranktrace: nothing compared: {run_dir}: --capture 2, but "
                                      f"the run has 1 capture window")


def test_the_breakdown_names_rank_1_late_in_the_captured_steps(slow_run, tmp_path):
    folder, _ = slow_run
    run_dir = copy_run(folder / "traces" / "slow", tmp_path / "slow")  # analysis writes a cache
    (window,), _ = read_captures(run_dir)
    document = open_run(run_dir).document()
    (captured,) = document["captures"]
    assert captured["steps"] == window["steps"] and captured["rank"] == 1
    # rank 1's busy loop comes after its gradients are reduced: rank 0 waits for it each step
    assert captured["late_rank"] == 1
    assert captured["wait_ms_per_step"]["0"] > SLOW_MS / 2
    assert captured["mean_step_ms"] - captured["before_step_ms"] > SLOW_MS / 2
    assert "Captured: " + captured["text"] in document["verdict"]["lines"]


def test_training_under_capture_is_bit_identical(slow_run):
    folder, _ = slow_run
    untraced = (folder / "untraced.txt").read_text().splitlines()
    assert len(untraced) == 40
    assert (folder / "traced.txt").read_text().splitlines() == untraced


def test_a_window_asked_on_demand_is_traced_at_the_same_steps_on_every_rank(tmp_path):
    go = tmp_path / "go"
    run = start(SCRIPT, "--steps", "80", "--step-ms", "20", "--slow-from", "15", "--slow-ms",
                "0", "--wait-for", go, nproc=2,
                tracer=("--out", tmp_path / "traces", "--run-name", "asked"))
    run_dir = tmp_path / "traces" / "asked"
    try:
        waiting = set()
        while waiting != {"0", "1"}:
            line = run.wait_for_line("waiting at step 15")
            waiting |= set(re.findall(r"rank (\d+) waiting at step 15", line))
        asked = run_module("tracer.capture", run_dir, "--steps", "2", timeout=60)
    finally:
        go.touch()
    out, err = run.communicate(timeout=120)
    assert run.popen.returncode == 0, err[-3000:]
    assert asked.returncode == 0, asked.stderr
    said = re.search(r"will profile steps (\d+)-(\d+) \(ask 0\)", asked.stdout)
    assert said, asked.stdout
    first, last = int(said[1]), int(said[2])
    assert last == first + 1 and 15 < first and last < 80
    for rank in (0, 1):
        assert [(r.trigger, r.first_step, r.steps, r.missed) for r in captures(run_dir, rank)] \
            == [("on_demand", first, 2, False)]
    assert traced_steps(run_dir, 0) == traced_steps(run_dir, 1) == [[7, 8, 9], [first, last]]
    # The run has ended: one clear line, exit 1; and a folder that is not there.
    ended = run_module("tracer.capture", run_dir)
    assert (ended.returncode, ended.stdout) == (1, "")
    assert ended.stderr == (f"ranktrace: capture: the run in '{run_dir}' has ended (every rank "
                            f"wrote run_end)\n")
    missing = run_module("tracer.capture", tmp_path / "nothing")
    assert (missing.returncode, missing.stderr) == (
        1, f"ranktrace: capture: no run folder '{tmp_path / 'nothing'}'\n")
