"""Windows opened when a rank's steps turn slow (on by default) and on demand (python -m
tracer.capture), on 2-rank DDP runs of 1 ms steps: every rank traces the same steps, the capture
record says when the change began, by how much and on which ranks, and the training is what it
is untraced.

The runs of issue 37, with the tracer's default options: rank 1 sleeps 60 ms before every
forward pass from step S on (tests/scripts/slow_from.py --slow-where forward), so that rank 0
waits for it in the same step's all-reduce: S = 2000 (its first 2,000 steps are a clean run of
fast steps on a machine the other tests load: no window there; 50 slow steps of the issue's 100
are enough for the window), and 80 steps with S = 50. And a phase that ends: rank 1's data loader
sleeps 60 ms a batch from 30% to 60% of a 120-step run (one window, none when it ends). Each
window opens within 0.25 s, at the pace of the slow steps, after the change is confirmed (its
5th slow step): about a dozen steps after it began. The analysis of the same runs finds each
slow phase where it began and names rank 1 late in it (docs/definitions.md, "Phases"). The run
on demand waits at step 15 until the test has asked for two steps.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from analysis import open_run
from analysis.crossrank.what_if import TIE_SHARE
from analysis.ingest.capture_records import read_captures
from analysis.report.html import write_html_report
from analysis.report.text_report import text_report
from helpers.launch import launch, run_module, start
from helpers.run_copies import copy_run
from helpers.runs import overloaded as is_overloaded
from helpers.tracer_files import load_trace, read_jsonl, summaries
from tracer import schema

SCRIPT = "tests/scripts/slow_from.py"
SLOW_MS = 60
FAST = ("--step-ms", "0", "--slow-rank", "1", "--slow-ms", str(SLOW_MS))
# name -> (steps, first slow step, first step no longer slow, where the time goes)
PHASES = {"late": (2050, 2000, None, "forward"), "early": (80, 50, None, "forward"),
          "loader": (120, 36, 72, "data")}
# The window's first traced step comes at most this many steps after the change began: 4 slow
# steps to confirm it, one pass of the capture thread (0.1 s) and a margin of 0.25 s at 61 ms a
# step, one warm-up step; a loaded machine may add some.
WITHIN_STEPS = 25
# On an overloaded machine (helpers.runs.overloaded) a rank's fast steps slow for a second or
# more at a time: a real, sustained slowdown, which the trigger may capture
# (docs/tracer.md, Capturing slow steps). The clean steps may then get a window of their own
# before the change's.


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


def phase_args(name: str) -> tuple:
    steps, slow_from, slow_until, where = PHASES[name]
    return ("--steps", str(steps), "--slow-from", str(slow_from), "--slow-where", where, *FAST,
            *(("--slow-until", str(slow_until)) if slow_until else ()))


@pytest.fixture(scope="module")
def phase_runs(tmp_path_factory):
    """Each run of PHASES traced with the default options; the short one also untraced."""
    folder = tmp_path_factory.mktemp("capture-phases")
    untraced = launch(SCRIPT, *phase_args("early"), "--losses", folder / "untraced.txt",
                      nproc=2)
    assert untraced.returncode == 0, untraced.stderr[-3000:]
    stderr, overloaded = {}, {}
    for name in PHASES:
        traced = launch(SCRIPT, *phase_args(name), "--losses", folder / f"{name}.txt", nproc=2,
                        tracer=("--out", folder / "traces", "--run-name", name))
        assert traced.returncode == 0, traced.stderr[-3000:]
        stderr[name] = traced.stderr
        overloaded[name] = is_overloaded(os.getloadavg()[0])
    return folder, stderr, overloaded


@pytest.mark.parametrize("name", ["late", "early", "loader"])
def test_a_slow_phase_gets_one_window_soon_after_it_began_at_the_same_steps_on_both_ranks(
        phase_runs, name):
    folder, stderr, overloaded = phase_runs
    run_dir = folder / "traces" / name
    steps, slow_from, slow_until, _ = PHASES[name]
    every = {rank: captures(run_dir, rank) for rank in (0, 1)}
    # One window, for the change, on both ranks: none in the fast steps before it (the clean
    # 2,000 steps of "late") unless the machine was overloaded, none when the loader's phase ends.
    records = {rank: [r for r in found if r.trigger_step >= slow_from - PHASE_WITHIN]
               for rank, found in every.items()}
    assert len(records[0]) == len(records[1]) == 1, every
    earlier = [r.first_step for r in every[0] if r.trigger_step < slow_from - PHASE_WITHIN]
    assert earlier == [r.first_step for r in every[1]
                       if r.trigger_step < slow_from - PHASE_WITHIN]
    if not overloaded[name]:
        assert earlier == [], every
    (first,), (second,) = records.values()
    assert first.trigger == "slow_step" and not first.missed and not second.missed
    assert (second.trigger_step, second.first_step, second.ranks) == (
        first.trigger_step, first.first_step, first.ranks)
    # It began at the first slow step on rank 1, and on rank 0, which waits for it, at the
    # same step: both are named with the step and the size of their change. Rank 1's change
    # came before its first collective of the step, rank 0's after it: rank 1 is late.
    # (Within a few steps before it on an overloaded machine, whose slow bursts may run into it.)
    soonest = slow_from - (PHASE_WITHIN if overloaded[name] else 0)
    assert soonest <= first.trigger_step <= slow_from + 1
    assert {c.rank for c in first.ranks} == {0, 1}
    assert all(soonest <= c.step <= slow_from + 1 and c.factor > 5 for c in first.ranks)
    assert first.after_ms > SLOW_MS and first.confirmed_step >= first.trigger_step + 3
    assert (first.trigger_rank, first.late_rank, first.waiting_ranks) == (1, 1, [0])
    late = next(c for c in first.ranks if c.rank == 1)
    assert late.sync_after_ms - late.sync_before_ms > SLOW_MS * 0.9
    # Its steps are slow-phase steps, soon after the change, traced on both ranks.
    window = list(range(first.first_step, first.first_step + 3))
    assert slow_from < window[0] <= slow_from + WITHIN_STEPS
    assert window[-1] < (slow_until or steps)
    before = [list(range(step, step + 3)) for step in earlier]
    assert traced_steps(run_dir, 0) == traced_steps(run_dir, 1) == [[7, 8, 9], *before, window]
    for rank in (0, 1):
        profiled = [s.step for s in read_jsonl(run_dir / schema.STEPS_FILE.format(rank=rank),
                                               schema.StepRecord) if s.in_profiler_window]
        assert profiled == [6, 7, 8, 9, *[s for w in before for s in (w[0] - 1, *w)],
                            window[0] - 1, *window]
    windows = 2 + len(earlier)
    assert ({r: int(s["windows"]) for r, s in summaries(stderr[name]).items()}
            == {0: windows, 1: windows})
    assert "ranktrace: rank" not in stderr[name].replace("ranktrace: rank0 ok", "").replace(
        "ranktrace: rank1 ok", "")  # no tracer line but the summaries


def test_the_captured_window_against_the_default_one_shows_the_slow_steps(phase_runs, tmp_path):
    folder = phase_runs[0]
    run_dir = copy_run(folder / "traces" / "early", tmp_path / "early")  # analysis writes a cache
    (window,), _ = read_captures(run_dir)
    done = run_module("analysis.diff", run_dir, "--capture", "1", "--format", "json",
                      "--resamples", "200")
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    steps = f"{window['steps'][0]}-{window['steps'][-1]}"
    assert document["a"]["path"] == f"{run_dir}, steps 7-9 (the profiler's first fixed window)"
    assert document["b"]["path"] == (f"{run_dir}, steps {steps} (captured on a slow step: rank "
                                     f"{window['rank']}'s step {window['step']}, "
                                     f"{window['ratio']:.2f}x its median)")
    change = document["verdict"]
    assert (change["steps_a"], change["steps_b"]) == (3, 3)
    # Rank 1's sleep (and rank 0's wait for it) in every captured step: a wall-clock wait,
    # which load cannot shorten.
    assert change["median_b_ms"] > SLOW_MS
    assert change["median_b_ms"] - change["median_a_ms"] > SLOW_MS / 2
    assert change["change_pct"] > 100
    # A capture the run does not have: one line naming the run and how many it has.
    missing = run_module("analysis.diff", run_dir, "--capture", "2")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"ranktrace: nothing compared: {run_dir}: --capture 2, but "
                                      f"the run has 1 capture window")


def test_the_breakdown_names_rank_1_late_in_the_captured_steps(phase_runs, tmp_path):
    folder = phase_runs[0]
    run_dir = copy_run(folder / "traces" / "early", tmp_path / "early")  # analysis writes a cache
    (window,), _ = read_captures(run_dir)
    document = open_run(run_dir).document()
    (captured,) = document["captures"]
    assert captured["steps"] == window["steps"]
    # rank 1 sleeps before its forward pass: rank 0 waits for it in each step's all-reduce
    assert captured["late_rank"] == 1
    assert captured["wait_ms_per_step"]["0"] > SLOW_MS / 2
    assert captured["mean_step_ms"] - captured["before_step_ms"] > SLOW_MS / 2
    assert "Captured: " + captured["text"] in document["verdict"]["lines"]


# ---- the analysis's phases on the same runs (docs/definitions.md, "Phases") -------------------
# Issue 37: the verdict names rank 1 and the step where the slow phase began, within 3 steps; the
# fast steps before it (the clean 2,000 of "late") name no late rank.
PHASE_WITHIN = 3


@pytest.fixture(scope="module")
def phase_analyses(phase_runs):
    folder = phase_runs[0]
    return {name: open_run(folder / "traces" / name, use_cache=False) for name in PHASES}


@pytest.mark.parametrize("name", ["late", "early", "loader"])
def test_the_analysis_cuts_the_run_where_the_slow_phase_began_and_names_rank_1_in_it(
        phase_analyses, name):
    run = phase_analyses[name]
    steps, slow_from, slow_until, _ = PHASES[name]
    changes = [slow_from, *([slow_until] if slow_until else [])]
    phases = run.phases
    assert [p.first_step for p in phases][:1] == [1] and phases[-1].last_step == steps - 1
    assert len(phases) == len(changes) + 1, [(p.first_step, p.late_rank) for p in phases]
    assert all(abs(p.first_step - c) <= PHASE_WITHIN for p, c in zip(phases[1:], changes))
    slow = phases[1]
    assert (slow.late_rank, slow.waiting_ranks) == (1, [0])
    assert slow.late_ms_per_step == pytest.approx(SLOW_MS, rel=0.3)
    assert slow.ranks[0]["wait_ms"] == pytest.approx(SLOW_MS, rel=0.3)
    # Where rank 1 is late because its loader sleeps, removing its loading gaps saves what
    # having it on time saves (60.31 and 60.29 ms in one CI run), and the cause is told first
    # (on rank 1, or on any rank where that saves more by over 2%); rank 1 on time only where
    # it saves more than 2% beyond every such cause (rank 1 also late otherwise, on a loaded
    # machine).
    said = {"rank 1 on time": "rank 1 were on time"}
    if PHASES[name][3] == "data":
        causes = ["no data loading gaps on rank 1", "no data loading gaps on any rank"]
        said.update({cause: cause for cause in causes})
        steps_of = run.critical.what_if_steps
        mine = steps_of[steps_of["step"].between(slow.first_step, slow.last_step)]
        if slow.what_if["change"] == "rank 1 on time":
            assert all(mine[cause].mean() < (1 - TIE_SHARE) * mine["rank 1 on time"].mean()
                       for cause in causes if cause in mine), slow.what_if
    assert slow.what_if["change"] in said, slow.what_if
    assert slow.what_if["saved_ms_per_step"] == pytest.approx(SLOW_MS, rel=0.3)
    if name == "late":
        # 2,000 clean fast steps first (1.4 ms): no rank late in them by more than the machine's
        # own noise. On the shared 2-core CI machine the straggler rule once named rank 1 there,
        # 0.125 ms a step behind in most of 1,999 steps of 1.36 ms (what its what-if saved): a
        # real, steady lead of one core, but a sliver of a step, never the slow phase's 60 ms.
        clean = phases[0]
        assert clean.late_rank is None or clean.late_ms_per_step < 0.25 * clean.step_ms, clean
        assert run.cross_rank.failed == {}
    if slow_until:  # the phase that ends: rank 0 no longer waits for rank 1's loader
        assert phases[2].ranks[0]["wait_ms"] < SLOW_MS / 10
    lines = run.verdict.lines
    span = (f"From step {slow.first_step} (the last {steps - slow.first_step} steps, "
            if not slow_until else
            f"From step {slow.first_step} to {slow.last_step} ({slow.steps} steps, ")
    assert lines[0].startswith(span + f"{slow.share_pct:.0f}% of the run's time) rank 1 is late by")
    assert lines[1].startswith(f"What if, in those steps: if {said[slow.what_if['change']]}: ")
    assert not any(line.startswith(("Waiting:", "What if:")) for line in lines)


def test_the_writers_show_the_phases(phase_analyses, tmp_path):
    run = phase_analyses["early"]
    slow = run.phases[-1]
    last = PHASES["early"][0] - 1
    document = run.document()
    # The JSON holds the analysis's phases as they are (the fast phase before the change may
    # name a rank the load made late: the straggler rule's own tests cover that case).
    assert [(p["first_step"], p["late_rank"]) for p in document["phases"]] == [
        (1, run.phases[0].late_rank), (slow.first_step, 1)]
    text = text_report(run.report)
    assert re.search(rf"^\s*{slow.first_step}-{last}\s+{last - slow.first_step + 1}\s", text,
                     re.M)
    page = write_html_report(run.report, tmp_path / "report.html")["path"].read_text()
    section = re.search(r'<section id="phases">.*?</section>', page, re.S).group(0)
    bands = re.findall(r'<rect class="band"[^>]*><title>([^<]*)</title>', section)
    assert len(bands) == 2 and bands[1].startswith(f"steps {slow.first_step}-{last}: ")
    assert "rank 1 late by" in bands[1]


def test_training_under_capture_is_bit_identical(phase_runs):
    folder = phase_runs[0]
    untraced = (folder / "untraced.txt").read_text().splitlines()
    assert len(untraced) == 80
    assert (folder / "early.txt").read_text().splitlines() == untraced


def test_a_window_asked_on_demand_is_traced_at_the_same_steps_on_every_rank(tmp_path):
    go = tmp_path / "go"
    # steps of 20 ms asleep: the window opens 1 s of steps (about 50) after the ask
    run = start(SCRIPT, "--steps", "80", "--step-ms", "0", "--step-sleep-ms", "20", "--slow-from",
                "15", "--slow-ms", "0", "--wait-for", go, nproc=2,
                tracer=("--out", tmp_path / "traces", "--run-name", "asked"))
    run_dir = tmp_path / "traces" / "asked"
    try:
        waiting = set()
        while waiting != {"0", "1"}:
            line = run.wait_for_line("waiting at step 15")
            waiting |= set(re.findall(r"rank (\d+) waiting at step 15", line))
        asked = run_module("tracer.capture", run_dir, "--active", "2", timeout=60)
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
