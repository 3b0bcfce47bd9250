"""The capture windows on their own: the slow-step rule on synthetic step times (median, factor,
warm-up, cool-down, bound), which requested windows every rank opens, where a window is placed
beside the fixed schedule, the request files, the profiler driver opening a planned window at
its step, and the watcher that answers asks and names the rank that slowed first."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerAction, schedule

from helpers.tracer_files import load_trace
from tracer import schema
from tracer.capture.capture_requests import FileLog
from tracer.capture.capture_watch import CaptureWatch, _Window
from tracer.capture.slow_steps import (
    COOLDOWN_WINDOWS,
    HISTORY,
    MARGIN_STEPS,
    MIN_HISTORY,
    WARMUP_STEPS,
    CapturePlan,
    SlowStepRule,
    margin_steps,
    place_window,
)
from tracer.options.config import ConfigError, TracerConfig, resolve
from tracer.session.run_folder import LaunchInfo

MS = 1_000_000


def fired(rule: SlowStepRule, durations_ms, windows=()) -> list[tuple[int, float]]:
    """(step, ratio) of each trigger over steps 0.. with these times; `windows`: steps inside
    a profiler window."""
    found = []
    for step, ms in enumerate(durations_ms):
        trigger = rule.observe(step, int(ms * MS), step in windows)
        if trigger is not None:
            found.append((trigger.step, round(trigger.ratio, 3)))
    return found


# ---- the rule --------------------------------------------------------------------------------
def test_a_step_at_the_factor_times_the_running_median_triggers_and_one_just_below_does_not():
    steady = [10.0] * 20
    assert fired(SlowStepRule(2.0, 3, 4), steady + [20.0]) == [(20, 2.0)]
    assert fired(SlowStepRule(2.0, 3, 4), steady + [19.9]) == []


def test_the_median_is_of_the_steps_before_and_ignores_one_spike():
    # 10 ms and 30 ms alternating: median 20 (even count: the mean of the two middle ones).
    times = [10.0] * WARMUP_STEPS + [10.0, 30.0] * 10  # the warm-up's steps are not in it
    rule = SlowStepRule(4.0, 3, 4)
    assert fired(rule, times) == []
    assert rule.median_ns == 20 * MS
    # One 200 ms spike moves the median of 21 steps to 30 ms, not to the mean (about 28.6).
    assert rule.observe(len(times), 200 * MS).ratio == 10.0
    assert rule.median_ns == 30 * MS


def test_the_median_forgets_steps_older_than_its_history():
    rule = SlowStepRule(2.0, 3, 4)
    fired(rule, [100.0] * (WARMUP_STEPS + HISTORY) + [10.0] * HISTORY)
    assert rule.median_ns == 10 * MS


def test_nothing_triggers_during_the_warm_up_or_before_the_median_has_enough_steps():
    # Step 0 is slow (start-up); so is the first judged step's predecessor set.
    slow_start = [500.0] + [10.0] * (WARMUP_STEPS - 1)
    assert fired(SlowStepRule(2.0, 3, 4), slow_start + [10.0] * 10) == []
    # Steps WARMUP_STEPS.. build the median; the first judged is after MIN_HISTORY of them.
    first_judged = WARMUP_STEPS + MIN_HISTORY
    times = [10.0] * first_judged + [50.0]
    assert fired(SlowStepRule(2.0, 3, 4), times) == [(first_judged, 5.0)]
    early = [10.0] * (first_judged - 1) + [50.0]
    assert fired(SlowStepRule(2.0, 3, 4), early) == []


def test_steps_inside_profiler_windows_are_neither_judged_nor_in_the_median():
    times = [10.0] * 20 + [40.0] * 3 + [10.0] * 5
    assert fired(SlowStepRule(2.0, 3, 4), times, windows={20, 21, 22}) == []
    rule = SlowStepRule(2.0, 3, 4)
    fired(rule, times, windows={20, 21, 22})
    assert rule.median_ns == 10 * MS


def test_after_a_trigger_the_cool_down_keeps_it_quiet_then_it_may_fire_again():
    window = 4
    cooldown = COOLDOWN_WINDOWS * window
    times = [10.0] * 20 + [30.0] + [10.0] * (cooldown - 1) + [30.0] + [10.0] + [30.0]
    # Step 20 fires; 21..28 are quiet (a slow step at 28 is not judged); 30 fires again.
    assert cooldown == 8
    assert [s for s, _ in fired(SlowStepRule(2.0, 3, window), times)] == [20, 30]


def test_a_window_opened_on_another_ranks_trigger_quiets_its_steps_but_not_those_before():
    rule = SlowStepRule(2.0, 3, 4)
    fired(rule, [10.0] * 20)
    rule.note_window(30, 32)  # another rank's window, traced steps 30-32
    assert rule.observe(20, 30 * MS) is not None  # before it: names this rank as slow first
    rule2 = SlowStepRule(2.0, 3, 4)
    fired(rule2, [10.0] * 20)
    rule2.note_window(20, 22)
    # 20..22 + 8 quiet, whatever their time; 31 is judged again.
    assert [rule2.observe(s, 30 * MS) for s in range(20, 31)] == [None] * 11
    assert rule2.observe(31, 30 * MS) is not None


def test_no_trigger_once_the_bound_of_windows_is_reached():
    rule = SlowStepRule(2.0, 2, 4)
    fired(rule, [10.0] * 20)
    rule.note_window(30, 32)
    rule.note_window(60, 62)
    assert rule.observe(100, 50 * MS) is None
    assert rule.observe(59, 50 * MS) is not None  # before the last window: may name this rank
    assert SlowStepRule(2.0, 0, 4).observe(20, 50 * MS) is None


def test_the_margin_is_enough_steps_for_half_a_second_and_never_fewer_than_three():
    assert margin_steps(None) == MARGIN_STEPS
    assert margin_steps(10 * MS) == 50  # 0.5 s of 10 ms steps
    assert margin_steps(400 * MS) == MARGIN_STEPS
    assert margin_steps(100 * MS, 1.0) == 10


# ---- which windows are opened, and where --------------------------------------------------------
def test_every_rank_opens_the_same_windows_from_the_same_requests():
    def decisions():
        plan = CapturePlan(max_captures=2, window_steps=4, warmup=1)
        return [plan.decide(t, f, 3).accepted for t, f in
                (("slow_step", 30), ("slow_step", 31),   # the same slowdown, seen by a peer
                 ("slow_step", 40),                      # within the cool-down after step 32
                 ("on_demand", 33),                      # no idle step between it and 32
                 ("slow_step", 50), ("slow_step", 80))]  # the bound of 2 reached at 50
    assert decisions() == decisions() == [True, False, False, False, True, False]
    plan = CapturePlan(max_captures=3, window_steps=4, warmup=1)
    assert plan.decide("on_demand", 10, 3).accepted
    why = plan.decide("on_demand", 14, 3)
    assert not why.accepted and why.why == "it overlaps the window of steps 10-12"
    assert plan.decide("on_demand", 15, 3).accepted  # warm-up 14, one idle step (13) between


def test_a_slowdown_whose_window_comes_before_an_earlier_ones_is_opened_too():
    # A spike at step 14 of 8 ms steps gets a window 0.5 s later (steps 76-78); the slowdown at
    # step 50, at 80 ms a step, gets one 8 steps on (58-60), decided later for earlier steps.
    plan = CapturePlan(max_captures=3, window_steps=4, warmup=1)
    assert plan.decide("slow_step", 76, 3).accepted
    assert plan.decide("slow_step", 58, 3).accepted
    # Within the cool-down before a window, as after one: not opened.
    why = plan.decide("slow_step", 67, 3)
    assert not why.accepted
    assert why.why == "within the cool-down of 8 steps of the window of steps 76-78"


def test_a_window_is_placed_clear_of_the_fixed_schedule():
    fixed = schedule(skip_first=5, wait=1, warmup=1, active=3, repeat=1)  # busy steps 6-9
    idle = ProfilerAction.NONE
    assert place_window(20, 3, 1, fixed, idle) == 20
    assert place_window(8, 3, 1, fixed, idle) == 12  # warm-up 11, idle step 10 after the window
    assert place_window(3, 3, 1, fixed, idle) == 12  # its idle step after it, 6, is busy
    assert place_window(2, 3, 1, fixed, idle) == 2  # warm-up 1, traced 2-4, idle 0 and 5
    always = schedule(wait=0, warmup=1, active=3, repeat=0)
    assert place_window(0, 3, 1, always, idle, search=100) is None


# ---- the request files -------------------------------------------------------------------------
def test_requests_are_numbered_in_order_and_two_writers_never_share_a_number(tmp_path):
    a, b, reader = FileLog(str(tmp_path)), FileLog(str(tmp_path)), FileLog(str(tmp_path))
    req = schema.CaptureRequest(trigger="slow_step", trigger_step=3, first_step=9, steps=3,
                                t_ns=1, trigger_rank=1, ratio=2.5)
    assert [a.append(req), b.append(req), a.append(req)] == [0, 1, 2]
    got = reader.read_new()
    assert [n for n, _ in got] == [0, 1, 2] and got[0][1] == req
    assert reader.read_new() == []
    (tmp_path / schema.CAPTURE_REQUEST_FILE.format(index=3)).write_bytes(b'{"trigger": ')
    assert reader.read_new() == [(3, None)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"capture.request{n}.jsonl" for n in range(4)]  # no temporary file left


# ---- the option -------------------------------------------------------------------------------
def test_capture_slow_steps_takes_an_optional_factor_before_the_script():
    config, script, args = resolve(["--capture-slow-steps", "train.py", "--capture-slow-steps"])
    assert (config.capture_slow_steps, script, args) == (2.0, "train.py", ["--capture-slow-steps"])
    assert resolve(["--capture-slow-steps", "3", "train.py"])[0].capture_slow_steps == 3.0
    assert resolve(["--capture-slow-steps", "--active", "5", "t.py"])[0].active == 5
    assert resolve(["t.py"])[0].capture_slow_steps == 0.0
    assert resolve(["t.py"], {"RANKTRACE_CAPTURE_SLOW_STEPS": "1.5"})[0].capture_slow_steps == 1.5
    for bad in ("1", "0.5"):
        try:
            resolve(["--capture-slow-steps", bad, "t.py"])
        except ConfigError as exc:
            assert "--capture-slow-steps must be > 1" in str(exc)
        else:
            raise AssertionError(bad)


# ---- the profiler driver opening a planned window ---------------------------------------------
def run_driver(driver, steps: int, plan_at: dict[int, tuple[int, int]]) -> list[bool]:
    planned = []
    driver.start()
    for step in range(steps):
        if step in plan_at:
            planned.append(driver.plan_window(*plan_at[step]))
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        driver.step()
    driver.stop()
    return planned


def traced_steps(folder) -> list[list[str]]:
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".pt.trace.json.gz"))
    return [sorted(e["name"] for e in load_trace(folder / n)["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#")) for n in names]


def test_the_driver_opens_a_planned_window_at_its_step_beside_the_fixed_one(tmp_path):
    from tracer.probes.profiler import ProfilerDriver

    config = TracerConfig(skip_first=2, wait=0, warmup=1, active=2, windows=1)  # traces 3-4
    driver = ProfilerDriver(config, str(tmp_path), 1, use_cuda=False)
    # Planned during step 6 for steps 12-14 (warm-up 11); one overlapping the fixed window and
    # one already begun are refused.
    assert run_driver(driver, 20, {6: (12, 3), 0: (4, 2), 10: (10, 3)}) == [False, True, False]
    assert traced_steps(tmp_path) == [["ProfilerStep#3", "ProfilerStep#4"],
                                      ["ProfilerStep#12", "ProfilerStep#13", "ProfilerStep#14"]]
    assert driver.windows == 2 and driver.take_missed() == []


def test_a_window_planned_as_its_step_passes_is_dropped_and_noted(tmp_path):
    from tracer.probes.profiler import ProfilerDriver

    driver = ProfilerDriver(TracerConfig(windows=1, skip_first=0, wait=0, active=1, warmup=0),
                            str(tmp_path), 0, use_cuda=False)
    driver.start()
    for _ in range(5):
        driver.step()
    # The worker thread's check saw step 4, the training thread moved on before it read it.
    driver._captures, driver._capture_due = ((5, 6, 6),), 5
    driver._step = 6
    driver._open_if_due()
    assert driver._profile is None and driver.take_missed() == [6] and driver._capture_due is None
    driver.stop()


# ---- the watcher: asks answered by one rank, the rank that slowed first named ------------------
class FakeDriver:
    def __init__(self, step: int):
        self._step = step
        self._idle = ProfilerAction.NONE
        self.planned: list[tuple[int, int]] = []
        self.stopped = False

    def fixed_action(self, k):
        return self._idle

    def plan_window(self, first, steps):
        self.planned.append((first, steps))
        return first - 1 > self._step

    def take_missed(self):
        return []


def watcher(tmp_path, rank: int, step: int):
    written = []
    watch = CaptureWatch(TracerConfig(), LaunchInfo(rank=rank, world_size=2), str(tmp_path),
                         FakeDriver(step), written.append)
    return watch, written


def test_an_ask_is_answered_by_rank_0_from_its_step_and_every_rank_plans_it(tmp_path):
    FileLog(str(tmp_path), schema.CAPTURE_ASK_FILE, schema.CaptureAsk).append(
        schema.CaptureAsk(steps=0, t_ns=1))
    zero, written0 = watcher(tmp_path, 0, 40)
    one, written1 = watcher(tmp_path, 1, 40)
    one.on_worker_pass()
    assert one.driver.planned == []  # rank 1 does not answer
    zero.on_worker_pass()
    one.on_worker_pass()
    first = 40 + MARGIN_STEPS + 1  # no pace yet: the fewest steps, then the warm-up
    assert zero.driver.planned == one.driver.planned == [(first, 3)]
    for watch in (zero, one):
        watch.driver._step = first + 4
        watch.on_worker_pass()
    assert [(r.rank, r.trigger, r.first_step, r.steps, r.missed) for r in written0 + written1] \
        == [(0, "on_demand", first, 3, False), (1, "on_demand", first, 3, False)]


def test_of_one_slowdowns_requests_the_earliest_slow_step_names_the_trigger():
    def req(rank, step, ratio):
        return schema.CaptureRequest(trigger="slow_step", trigger_step=step, first_step=30,
                                     steps=3, t_ns=0, trigger_rank=rank, ratio=ratio)
    window = _Window(req(0, 21, 6.0), planned=True)
    window.contenders.append(req(1, 20, 5.0))
    assert window.trigger().trigger_rank == 1
    tie = _Window(req(1, 20, 5.0), planned=True)
    tie.contenders.append(req(0, 20, 5.5))
    assert tie.trigger().trigger_rank == 0  # the same step: the higher ratio


def test_a_later_slowdown_is_its_own_trigger_not_a_contender_of_an_earlier_window(tmp_path):
    def req(rank, step, first):
        return schema.CaptureRequest(trigger="slow_step", trigger_step=step, first_step=first,
                                     steps=3, t_ns=0, trigger_rank=rank, ratio=8.0)
    log = FileLog(str(tmp_path))
    for request in (req(1, 14, 76), req(1, 50, 58), req(0, 51, 59), req(1, 52, 77)):
        log.append(request)
    watch, written = watcher(tmp_path, 0, 52)
    watch.on_worker_pass()
    assert watch.driver.planned == [(76, 3), (58, 3)]
    watch.driver._step = 80
    watch.on_worker_pass()
    # Rank 0's request (step 51) saw the slowdown of step 50; rank 1's of step 52 as well,
    # though its window overlapped the first one's: neither names step 14's window.
    assert sorted((r.first_step, r.trigger_rank, r.trigger_step) for r in written) == [
        (58, 1, 50), (76, 1, 14)]
    assert [len(w.contenders) for w in watch.windows] == [0, 2]


def test_a_window_decided_once_profiling_has_stopped_is_not_said_missed(tmp_path, capsys):
    FileLog(str(tmp_path)).append(schema.CaptureRequest(
        trigger="slow_step", trigger_step=78, first_step=88, steps=3, t_ns=0, trigger_rank=1,
        ratio=3.0))
    watch, written = watcher(tmp_path, 0, 80)
    watch.driver.stopped = True
    watch.driver.plan_window = lambda first, steps: False
    watch.on_worker_pass()
    watch.after_last_records(on_main=False)
    assert capsys.readouterr().err == "" and written == []
