"""The profiler driver's windows off the fixed schedule and the bounds of every window: a planned
window opened at its step beside the fixed one, one planned too late dropped and noted, a window
past --max-window-s or --max-window-mb closed at the next step end and written with what it
holds, its trace's metadata and a manifest problem saying why, and later windows unharmed."""

from __future__ import annotations

import time

import torch

from helpers.tracer_files import load_trace
from tracer import schema
from tracer.options.config import TracerConfig
from tracer.probes.profiler import ProfilerDriver


def run_driver(driver, steps: int, plan_at=None, step_s: float = 0.0, grow_at=None) -> list:
    """Drives `steps` steps; `plan_at`: step -> (first, steps) planned during it; `grow_at`:
    step -> MB allocated (and kept) during it. The plans' answers."""
    planned, kept = [], []
    driver.start()
    for step in range(steps):
        if plan_at and step in plan_at:
            planned.append(driver.plan_window(*plan_at[step]))
        if grow_at and step in grow_at:
            kept.append(bytearray(grow_at[step] << 20))
            kept[-1][::4096] = b"x" * len(kept[-1][::4096])  # touched: resident
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        if step_s:
            time.sleep(step_s)
        driver.step()
    driver.stop()
    return planned


def traces(folder) -> list[dict]:
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".pt.trace.json.gz"))
    return [load_trace(folder / n) for n in names]


def traced_steps(folder) -> list[list[int]]:
    return [sorted(int(e["name"].split("#")[1]) for e in trace["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#")) for trace in traces(folder)]


def test_the_driver_opens_a_planned_window_at_its_step_beside_the_fixed_one(tmp_path):
    config = TracerConfig(skip_first=2, wait=0, warmup=1, active=2, windows=1)  # traces 3-4
    driver = ProfilerDriver(config, str(tmp_path), 1, use_cuda=False)
    # Planned during step 6 for steps 12-14 (warm-up 11); one overlapping the fixed window, one
    # already begun and one longer than --max-window-steps are refused.
    assert run_driver(driver, 20, {6: (12, 3), 0: (4, 2), 10: (10, 3), 7: (40, 21)}) == [
        False, True, False, False]
    assert traced_steps(tmp_path) == [[3, 4], [12, 13, 14]]
    assert driver.windows == 2 and driver.take_missed() == []


def test_a_window_planned_as_its_step_passes_is_dropped_and_noted(tmp_path):
    driver = ProfilerDriver(TracerConfig(windows=1, skip_first=0, wait=0, active=1, warmup=0),
                            str(tmp_path), 0, use_cuda=False)
    driver.start()
    for _ in range(5):
        driver.step()
    # The capture thread's check saw step 4, the training thread moved on before it read it.
    driver._captures, driver._capture_due = ((5, 6, 6),), 5
    driver._step = 6
    driver._open_if_due()
    assert driver._profile is None and driver.take_missed() == [6] and driver._capture_due is None
    driver.stop()


def test_a_fixed_window_past_its_time_is_closed_written_and_said_so(tmp_path, capsys):
    written = []
    # Traces 1-8 at 0.1 s a step; cut once open 0.25 s: at the end of step 3 (open at step 0's
    # end, warm-up 1).
    config = TracerConfig(skip_first=0, wait=0, warmup=1, active=8, windows=1, max_window_s=0.25)
    driver = ProfilerDriver(config, str(tmp_path), 0, use_cuda=False,
                            write_manifest=written.append)
    run_driver(driver, 14, step_s=0.1)
    (trace,) = traces(tmp_path)
    (steps,) = traced_steps(tmp_path)
    cut = trace[schema.WINDOW_CUT_METADATA]
    assert steps == list(range(1, cut["cut_step"]))
    assert 3 <= cut["cut_step"] <= 5 and (cut["reason"], cut["first_step"]) == ("time", 1)
    (problem,) = written
    assert isinstance(problem, schema.TracerProblem) and problem.part == "profiler"
    assert problem.message.startswith(f"the window of steps 1-8 was closed at step "
                                      f"{cut['cut_step']}: open for ")
    assert problem.message.endswith(f"s, past --max-window-s 0.25; its trace holds steps 1-"
                                    f"{cut['cut_step'] - 1}")
    assert cut["message"] == problem.message
    assert capsys.readouterr().err == f"ranktrace: rank0 profiler: {problem.message}\n"
    assert driver.windows == 1 and driver.take_cuts() == {1: ("time", cut["cut_step"])}


def test_a_captured_window_past_its_memory_is_closed_and_the_next_one_opens(tmp_path):
    written = []
    config = TracerConfig(skip_first=0, wait=0, warmup=1, active=2, windows=1, max_window_mb=30,
                          max_window_steps=10)
    driver = ProfilerDriver(config, str(tmp_path), 0, use_cuda=False,
                            write_manifest=written.append)
    # The fixed window: steps 1-2. A captured one of 10 steps from 6, which grows by 40 MB in
    # step 8; then another at 20-22.
    assert run_driver(driver, 30, {3: (6, 10), 10: (20, 3)}, grow_at={8: 40}) == [True, True]
    assert traced_steps(tmp_path) == [[1, 2], [6, 7, 8], [20, 21, 22]]
    cut = traces(tmp_path)[1][schema.WINDOW_CUT_METADATA]
    assert (cut["reason"], cut["first_step"], cut["last_step"], cut["cut_step"]) == (
        "memory", 6, 15, 9)
    (problem,) = written
    assert "the process's resident memory grew by 4" in problem.message
    assert driver.windows == 3 and driver.take_cuts() == {6: ("memory", 9)}


def test_a_window_cut_in_its_warm_up_writes_no_trace(tmp_path):
    config = TracerConfig(skip_first=0, wait=0, warmup=3, active=2, windows=1, max_window_s=0.05)
    driver = ProfilerDriver(config, str(tmp_path), 0, use_cuda=False, write_manifest=[].append)
    run_driver(driver, 10, step_s=0.1)
    assert traces(tmp_path) == [] and driver.windows == 0
    assert driver.take_cuts() == {3: ("time", 1)}  # opened at step 0, cut at its end
