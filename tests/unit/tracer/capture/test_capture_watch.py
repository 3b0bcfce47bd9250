"""The capture watch on its own (tracer.capture.capture_watch.CaptureWatch), with a stand-in
profiler driver: a change in this rank's step ends asks every rank for one window, an ask is
answered by one rank and clipped to the bound, inputs of another run or out of range are
ignored with one line and a manifest problem, and the record names every rank's change."""

from __future__ import annotations

import collections
import threading
import time

from torch.profiler import ProfilerAction

from tracer import schema
from tracer.capture.capture_requests import FileLog
from tracer.capture.capture_watch import MAX_PROBLEMS, CaptureWatch, _Window
from tracer.capture.slow_steps import MARGIN_STEPS
from tracer.options.config import TracerConfig
from tracer.session.run_folder import LaunchInfo

MS = 1_000_000


class FakeDriver:
    def __init__(self, step: int):
        self._step = step
        self._idle = ProfilerAction.NONE
        self.planned: list[tuple[int, int]] = []
        self.stopped = False
        self.cuts: dict[int, tuple[str, int]] = {}

    def fixed_action(self, k):
        return self._idle

    def plan_window(self, first, steps):
        self.planned.append((first, steps))
        return first - 1 > self._step

    def take_missed(self):
        return []

    def take_cuts(self):
        cuts, self.cuts = self.cuts, {}
        return cuts


def watcher(run_dir, rank: int, step: int, ends=None, **config):
    written = []
    watch = CaptureWatch(TracerConfig(**config), LaunchInfo(rank=rank, world_size=2),
                         str(run_dir), FakeDriver(step), written.append, ends)
    watch.evidence_wait_s = 0.0  # a window's record as soon as it has closed
    return watch, written


def problems(written) -> list[str]:
    return [r.message for r in written if isinstance(r, schema.TracerProblem)]


def captures(written) -> list[schema.CaptureRecord]:
    return [r for r in written if isinstance(r, schema.CaptureRecord)]


def ask(run_dir, **fields) -> None:
    FileLog(str(run_dir), schema.CAPTURE_ASK_FILE, schema.CaptureAsk).append(
        schema.CaptureAsk(**{"steps": 0, "t_ns": time.time_ns(), "run": run_dir.name, **fields}))


def test_an_ask_is_answered_by_rank_0_from_its_step_and_every_rank_plans_it(tmp_path):
    ask(tmp_path)
    zero, written0 = watcher(tmp_path, 0, 40)
    one, written1 = watcher(tmp_path, 1, 40)
    one.run_pass()
    assert one.driver.planned == []  # rank 1 does not answer
    zero.run_pass()
    one.run_pass()
    first = 40 + MARGIN_STEPS + 1  # no pace yet: the fewest steps, then the warm-up
    assert zero.driver.planned == one.driver.planned == [(first, 3)]
    for watch in (zero, one):
        watch.driver._step = first + 4
        watch.run_pass()
    assert [(r.rank, r.trigger, r.first_step, r.steps, r.missed) for r in written0 + written1] \
        == [(0, "on_demand", first, 3, False), (1, "on_demand", first, 3, False)]


def test_an_ask_for_more_steps_than_the_bound_is_clipped_with_one_line_and_a_problem(
        tmp_path, capsys):
    ask(tmp_path, steps=10**9)
    zero, written = watcher(tmp_path, 0, 40)
    zero.run_pass()
    assert [steps for _, steps in zero.driver.planned] == [20]
    message = "capture ask 0 asks for 1000000000 steps: clipped to --max-window-steps 20"
    assert problems(written) == [message]
    assert capsys.readouterr().err == f"ranktrace: rank0 capture: {message}\n"
    zero.driver._step = 200
    zero.run_pass()
    (record,) = captures(written)
    assert (record.steps, record.asked_steps) == (20, 10**9)


def test_asks_of_another_run_dated_elsewhere_negative_or_unreadable_are_ignored(tmp_path):
    ask(tmp_path, run="other-run\x1b[2J")
    ask(tmp_path, t_ns=1)
    ask(tmp_path, t_ns=time.time_ns() + 10**15)
    ask(tmp_path, steps=-5)
    (tmp_path / schema.CAPTURE_ASK_FILE.format(index=4)).write_bytes(bytes(range(256)) * 16)
    zero, written = watcher(tmp_path, 0, 40)
    zero.run_pass()
    assert zero.driver.planned == []
    assert problems(written) == [
        f"capture ask 0 is for run 'other-run\\x1b[2J', not this one ({tmp_path.name!r}): "
        f"ignored",
        "capture ask 1 was written before this run started: ignored",
        "capture ask 2 is dated in the future: ignored",
        "capture ask 3 asks for -5 steps: ignored",
        "capture ask 4 cannot be read (not a CaptureAsk JSON object of at most 64 KiB): ignored"]


def test_requests_of_another_run_or_far_steps_are_ignored_and_rank_0_says_so_for_all(tmp_path):
    log = FileLog(str(tmp_path))
    base = dict(trigger="on_demand", t_ns=time.time_ns(), run=tmp_path.name)
    for fields in (dict(trigger_step=40, first_step=-10**12, steps=10**11),
                   dict(trigger_step=10**11, first_step=10**11 + 5, steps=3),
                   dict(trigger_step=40, first_step=50, steps=3, run="another"),
                   dict(trigger_step=40, first_step=50, steps=3, trigger="whenever"),
                   dict(trigger_step=40, first_step=50, steps=3, t_ns=5)):
        log.append(schema.CaptureRequest(**{**base, **fields}))
    (tmp_path / schema.CAPTURE_REQUEST_FILE.format(index=5)).write_bytes(b"\x00" * 4096)
    zero, written0 = watcher(tmp_path, 0, 40)
    one, written1 = watcher(tmp_path, 1, 40)
    for watch in (zero, one):
        watch.run_pass()
    assert zero.driver.planned == one.driver.planned == []
    assert problems(written1) == []
    assert problems(written0) == [
        "the window of steps -1000000000000--900000000001 asked on demand is not opened: "
        "100000000000 steps, more than --max-window-steps 20",
        "capture request 1 was asked at step 100000000000, more than 100000 steps from this "
        "rank's 40: ignored",
        f"capture request 2 is of run 'another', not this one ({tmp_path.name!r}): ignored",
        "capture request 3 has an unknown trigger 'whenever': ignored",
        "capture request 4 was written before this run started: ignored",
        "capture request 5 cannot be read (not a CaptureRequest JSON object of at most 64 KiB):"
        " ignored"]


def test_problems_are_said_at_most_a_bounded_number_of_times(tmp_path, capsys):
    for _ in range(MAX_PROBLEMS + 5):
        ask(tmp_path, steps=-1)
    zero, written = watcher(tmp_path, 0, 40)
    zero.run_pass()
    assert len(problems(written)) == MAX_PROBLEMS
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[-1] == (f"ranktrace: rank0 capture: more than {MAX_PROBLEMS} capture problems: "
                         f"the rest are not reported")


def steady_then_slow(ends: collections.deque, steps: int, slow_from: int, start_ns: int = 0):
    """End times of `steps` steps of 1 ms, 61 ms from `slow_from` on."""
    t = start_ns
    for step in range(steps):
        t += (61 if step >= slow_from else 1) * MS
        ends.append(t)
    return t


def test_a_change_in_this_ranks_step_ends_asks_every_rank_for_one_window(tmp_path):
    ends0, ends1 = collections.deque(), collections.deque()
    now = time.time_ns()
    steady_then_slow(ends0, 60, 50, now - 60 * 61 * MS)
    steady_then_slow(ends1, 60, 50, now - 60 * 61 * MS)
    zero, written0 = watcher(tmp_path, 0, 60, ends0)
    one, written1 = watcher(tmp_path, 1, 60, ends1)
    zero.run_pass()  # rank 0 sees it first: its request opens the window
    one.run_pass()  # rank 1's own request is the same slowdown
    zero.run_pass()
    assert zero.driver.planned == one.driver.planned
    ((first, steps),) = zero.driver.planned
    # 0.25 s at 61 ms a step (5 steps) after step 60, then the warm-up.
    assert (first, steps) == (60 + 5 + 1, 3)
    for watch in (zero, one):
        watch.driver._step = first + 4
        watch.run_pass()
    records = captures(written0) + captures(written1)
    assert len(records) == 2
    for record in records:
        assert (record.trigger, record.trigger_step, record.confirmed_step, record.first_step) \
            == ("slow_step", 50, 54, first)
        assert (record.factor, record.before_ms, record.after_ms) == (61.0, 1.0, 61.0)
        assert [(c.rank, c.step, c.factor) for c in record.ranks] == [(0, 50, 61.0),
                                                                      (1, 50, 61.0)]
        assert record.trigger_rank == 0  # the same step and factor: the lowest rank


def test_the_rank_that_slowed_before_its_collective_is_late_and_the_other_waits(tmp_path):
    # Rank 1 sleeps 60 ms before its forward pass from step 50: its first collective comes
    # 60 ms later in its step; rank 0's comes as early as before, and its step waits after it.
    # The times of the change's collectives come a drain later than its steps' ends: each rank
    # asks again once it has them, and the record takes them.
    now = time.time_ns()
    start = now - 60 * 61 * MS
    watches = []
    for rank in (0, 1):
        ends, issues, later = collections.deque(), collections.deque(), []
        steady_then_slow(ends, 60, 50, start)
        for step in range(1, 60):
            before = 60 if rank == 1 and step >= 50 else 0
            (issues if step < 50 else later).append((step, ends[step - 1] + (before + 0.5) * MS))
        watch, written = watcher(tmp_path, rank, 60, ends)
        watch._first_issues = issues
        watches.append((watch, written, issues, later))
    for watch, *_ in watches + watches:
        watch.run_pass()
    assert all(watch._unsettled for watch, *_ in watches)
    for _, _, issues, later in watches:
        issues.extend(later)
    for watch, *_ in watches + watches:
        watch.run_pass()
    assert not any(watch._unsettled for watch, *_ in watches)
    for watch, *_ in watches:
        watch.driver._step = 80
        watch.run_pass()
    for _, written, *_ in watches:
        (record,) = captures(written)
        assert (record.trigger_rank, record.late_rank, record.waiting_ranks) == (1, 1, [0])
        assert [(c.rank, c.sync_before_ms, c.sync_after_ms, c.slowed_itself)
                for c in record.ranks] == [(1, 0.5, 60.5, True), (0, 0.5, 0.5, False)]


def test_of_one_slowdowns_requests_the_earliest_change_names_the_trigger():
    def req(rank, step, factor):
        change = schema.RankChange(rank=rank, step=step, confirmed_step=step + 3, factor=factor,
                                   before_ms=1.0, after_ms=factor)
        return schema.CaptureRequest(trigger="slow_step", trigger_step=step, first_step=30,
                                     steps=3, t_ns=0, trigger_rank=rank, ratio=factor,
                                     change=change)
    window = _Window(req(0, 21, 60.0), planned=True)
    window.contenders.append(req(1, 20, 50.0))
    assert window.requests()[0].trigger_rank == 1
    assert [c.rank for c in window.ranks()] == [1, 0]
    tie = _Window(req(1, 20, 50.0), planned=True)
    tie.contenders += [req(0, 20, 55.0), req(0, 22, 70.0)]
    assert tie.requests()[0].trigger_rank == 0  # the same step: the larger factor
    assert [(c.rank, c.step) for c in tie.ranks()] == [(0, 20), (1, 20)]  # each rank once


def test_a_window_cut_short_says_so_in_its_record(tmp_path):
    ask(tmp_path, steps=10)
    zero, written = watcher(tmp_path, 0, 40)
    zero.run_pass()
    ((first, _),) = zero.driver.planned
    zero.driver.cuts = {first: ("time", first + 2)}
    zero.driver._step = first + 20
    zero.run_pass()
    (record,) = captures(written)
    assert (record.cut, record.cut_step, record.steps) == ("time", first + 2, 10)


def test_a_window_decided_once_profiling_has_stopped_is_not_said_missed(tmp_path, capsys):
    FileLog(str(tmp_path)).append(schema.CaptureRequest(
        trigger="on_demand", trigger_step=78, first_step=88, steps=3, t_ns=time.time_ns(),
        run=tmp_path.name))
    watch, written = watcher(tmp_path, 0, 80)
    watch.driver.stopped = True
    watch.driver.plan_window = lambda first, steps: False
    watch.run_pass()
    watch.after_last_records(on_main=False)
    assert capsys.readouterr().err == "" and written == []


class StuckStore:
    """A store that answers nothing until `released` is set (at most 10 s), then fails."""

    def __init__(self, released: threading.Event):
        self.released = released

    def add(self, key, value):
        self.released.wait(10)
        raise TimeoutError("the store did not answer")

    check = get = set = add


def test_a_store_that_does_not_answer_is_said_once_and_the_run_still_ends_in_bounded_time(
        tmp_path):
    from tracer.capture.capture_requests import StoreLog

    answered = threading.Event()
    answered.set()
    watch, written = watcher(tmp_path, 1, 40, collections.deque())
    watch.store = watch.log = StoreLog(StuckStore(answered), "run", 0)
    watch.run_pass()
    watch.run_pass()
    assert problems(written) == ["torchrun's store failed (TimeoutError: the store did not "
                                 "answer): capture requests are not read nor written any more "
                                 "on this rank"]
    # On its thread, held by the store: the run's end waits STOP_WAIT_S (0.5 s) at most, twice.
    held = threading.Event()
    slow, _ = watcher(tmp_path, 1, 40, collections.deque())
    slow.store = slow.log = StoreLog(StuckStore(held), "run", 0)
    slow.start()
    thread = slow._thread.thread
    time.sleep(0.3)
    started = time.monotonic()
    slow.on_script_end(clean=True, on_main=True)
    slow.after_last_records(on_main=True)
    assert time.monotonic() - started < 2
    assert thread.is_alive()  # left behind, a daemon thread
    held.set()
    thread.join(5)


def test_a_thread_that_fell_too_far_behind_the_steps_stops_judging_them(tmp_path, monkeypatch):
    import tracer.capture.capture_watch as capture_watch

    monkeypatch.setattr(capture_watch, "MAX_PENDING_ENDS", 10)
    ends = collections.deque(range(0, 10 * MS, MS), maxlen=10)
    watch, written = watcher(tmp_path, 0, 10, ends)
    watch.run_pass()
    assert watch.rule is None
    assert problems(written) == ["the capture thread fell 10 steps behind the training; the "
                                 "slow-step watch is off"]
    watch.run_pass()
    assert len(problems(written)) == 1
