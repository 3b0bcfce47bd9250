"""Windows off the profiler's fixed schedule, at the same steps on every rank (docs/tracer.md,
Capturing slow steps).

`CaptureWatch` works on a thread of its own, every PERIOD_S: it judges the times of the steps
that ended since its last pass (their end times, which the step clock appends to a deque of its
own on the training thread; tracer.capture.slow_steps.SlowStepRule), asks for a window when this
rank's steps have changed (a request in the ordered list of tracer.capture.capture_requests),
answers python -m tracer.capture's asks, reads the list, decides with
tracer.capture.slow_steps.CapturePlan which windows it opens, and plans each in the profiler
driver, which opens it on the training thread at its step. Nothing of it runs on the step-end
worker: a store that does not answer, or inputs that cannot be believed, never hold the step
records back.
Each window is noted in the manifest (CaptureRecord) once it has closed; a rank that learnt of
it too late says so. Inputs out of range are clipped or ignored, each with one line and a
manifest `problem` (at most MAX_PROBLEMS per run).
"""

from __future__ import annotations

import collections
import os
import threading
import time

import msgspec

from tracer import schema
from tracer.capture.capture_requests import FileLog, StoreBroken, StoreLog, shown
from tracer.capture.slow_steps import (
    HISTORY,
    MARGIN_S,
    MAX_LEAD_STEPS,
    ON_DEMAND_MARGIN_S,
    CapturePlan,
    Change,
    SlowStepRule,
    margin_steps,
    place_window,
)
from tracer.parts.log import say
from tracer.parts.part import Part
from tracer.parts.periodic import PeriodicThread

PERIOD_S = 0.1  # how often the request list is read
MAX_PROBLEMS = 10  # problem lines and records per run; one more line says the rest are not
# An ask or request dated this long before the run started, or after now, is not of this run
# (hosts' clocks differ by far less).
CLOCK_SLACK_NS = 60 * 10**9
# At the run's end, how long its last pass is waited for (twice at most): a store that does not
# answer holds a pass up to STORE_TIMEOUT_S, and SIGTERM's wrap-up has 4.5 s in all.
STOP_WAIT_S = 0.5
STEP_TIMES_KEPT = 4096  # steps whose start and first collective are kept (a change's and before)
# Step ends waiting for a pass at most: the queue keeps the newest, so that a thread that stopped
# reading costs bounded memory; one that fell this far behind no longer knows their steps.
MAX_PENDING_ENDS = 100_000
# How long a rank waits for its change's times to the first collective (the Flight Recorder's
# drains come every 0.2 to 2 s), and a window's record for every rank's.
EVIDENCE_WAIT_S = 2.5


def open_capture(setup, driver) -> Part | None:
    """The capture watch of the profiler driver `driver` (built by tracer.probes.profiler);
    None with --no-capture."""
    if setup.config.no_capture:
        return None
    c = setup.config
    ends = setup.track_step_ends(maxlen=MAX_PENDING_ENDS) if c.capture_slow_steps > 0 else None
    flight = setup.built("flight")  # the steps' first collectives, where torch records them
    return setup.build(CaptureWatch, c, setup.launch, setup.run_dir, driver,
                       setup.write_manifest, ends, getattr(flight, "first_issues", None))


class _Window:
    def __init__(self, request: schema.CaptureRequest, planned: bool):
        self.request = request
        self.planned = planned
        self.contenders: list[schema.CaptureRequest] = []  # later requests of its slowdown
        self.written = False
        self.cut: tuple[str, int] | None = None  # (why, the first step not traced)
        self.decided_s = time.monotonic()

    def requests(self) -> list[schema.CaptureRequest]:
        """Its slowdown's requests, one a rank, the rank that slowed first's first: by the step
        the change began, then a rank that slowed before its first collective over one that
        waited, then the largest factor, then the lowest rank; the same on every rank, which
        all read the same requests."""
        def key(r: schema.CaptureRequest):
            change = r.change
            waits = change is None or change.slowed_itself is not True
            return (r.trigger_step, waits, -(change.factor if change else 0.0),
                    r.trigger_rank or 0)

        return sorted(self._settled(), key=key)

    def _settled(self) -> list[schema.CaptureRequest]:
        """Its requests, each rank's change once: the one with its times to the first
        collective where the rank asked again with them."""
        best: dict[int | None, schema.CaptureRequest] = {}
        for request in [self.request, *self.contenders]:
            rank = request.change.rank if request.change else None
            seen = best.get(rank)
            if seen is None or (rank is not None and seen.change.slowed_itself is None
                                and request.change.slowed_itself is not None
                                and request.trigger_step == seen.trigger_step):
                best[rank] = request
        return list(best.values())

    def ranks(self) -> list[schema.RankChange]:
        """Each rank's change, once."""
        return [r.change for r in self.requests() if r.change is not None]


class CaptureWatch(Part):
    name = "capture"

    def __init__(self, config, launch, run_dir: str, driver, write_manifest,
                 step_ends: collections.deque | None = None,
                 first_issues: collections.deque | None = None):
        """`step_ends`: the step clock's end times, from step 0 on (tracer.steps.step_clock
        .StepClock.track_ends); None: no slow-step watch. `first_issues`: (step, host time of
        its first collective), in step order (tracer.comms.flight.FlightRecorder)."""
        self.config = config
        self.launch = launch
        self.rank = launch.rank
        self.driver = driver
        self.write_manifest = write_manifest
        self.run_name = os.path.basename(os.path.normpath(run_dir))
        self.start_ns = time.time_ns()
        self.files = FileLog(run_dir)
        self.asks = FileLog(run_dir, schema.CAPTURE_ASK_FILE, schema.CaptureAsk)
        self.store: StoreLog | None = None
        self.log: FileLog | StoreLog = self.files
        self._connect = launch.world_size > 1 and bool(
            launch.agent_store and launch.master_addr and launch.master_port)
        self._seen: tuple[int, int] | None = None  # (time_ns, step) at the last pass
        self.pace_ns: float | None = None  # time per step over the last pass that saw steps end
        self.plan = CapturePlan(config.max_captures, config.warmup + config.active,
                                config.warmup, config.max_window_steps)
        self.windows: list[_Window] = []
        self.captures = 0  # windows this rank opened
        self.rule = (SlowStepRule(config.capture_slow_steps)
                     if config.capture_slow_steps > 0 and step_ends is not None else None)
        self._ends = step_ends
        self._next_step = 0  # the step whose end comes next out of _ends
        self._last_end: int | None = None
        self._first_issues = first_issues
        # Of the last STEP_TIMES_KEPT steps: their start (the step before's end), and the host
        # time of their first collective.
        self._starts: dict[int, int] = {}
        self._issued: dict[int, int] = {}
        # This rank's requests still without the times of its change's first collectives (the
        # Flight Recorder is drained up to 2 s late), and until when to wait for them.
        self._unsettled: list[tuple[schema.CaptureRequest, float]] = []
        self.evidence_wait_s = EVIDENCE_WAIT_S
        # The fixed schedule's last busy step (None: it cycles to the end): past it, no step of
        # it needs asking about.
        self._fixed_until = (None if config.windows == 0 else config.skip_first + config.windows
                             * (config.wait + config.warmup + config.active))
        self._problems = 0
        self._said: set[str] = set()  # kinds of failure said once
        self._pass_lock = threading.Lock()
        self._thread = PeriodicThread("ranktrace-capture", PERIOD_S, self._locked_pass,
                                      self._thread_failed)

    # ---- the capture thread --------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def _locked_pass(self) -> None:
        with self._pass_lock:
            self.run_pass()

    def _thread_failed(self, exc: BaseException) -> None:
        """A bug of ours: capturing stops, training goes on."""
        self.fail(f"{type(exc).__name__}: {exc}; capturing is off")

    def run_pass(self) -> None:
        """One pass: what the rule found, the asks, the list, the windows that closed."""
        if self._connect:  # here, off the training thread, on the first pass
            self._connect = False
            try:
                self.store = self.log = StoreLog.connect(self.launch)
            except Exception as exc:
                say(shown(f"cannot reach torchrun's store ({type(exc).__name__}: {exc}); "
                           f"ranks agree on windows through files in the run folder"),
                    self.name, self.rank)
        now, step = time.time_ns(), self.driver._step
        if self._seen is not None and step > self._seen[1]:
            self.pace_ns = (now - self._seen[0]) / (step - self._seen[1])
        self._seen = (now, step)
        self._guarded_io("asks", self._answer_asks)
        self._judge_steps()
        self._guarded_io("requests", self._read_log)
        self._say_missed()
        self._write_due(self.driver._step)

    def _guarded_io(self, what: str, call, *args) -> None:
        """call(*args); a failure of the store (which is then not used again) or of the file
        system (tried again at the next pass) is said once."""
        try:
            call(*args)
        except StoreBroken as exc:
            if "store" not in self._said:
                self._said.add("store")
                self.problem(f"{exc}: capture requests are not read nor written any more on "
                             f"this rank")
        except Exception as exc:
            if what not in self._said:
                self._said.add(what)
                self.problem(f"reading the capture {what} failed ({type(exc).__name__}: {exc});"
                             f" tried again at each pass, said once")

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        self._thread.stop(STOP_WAIT_S)

    def close(self) -> None:
        self._thread.stop(STOP_WAIT_S)

    def after_last_records(self, on_main: bool) -> None:
        if not self._pass_lock.acquire(timeout=STOP_WAIT_S):
            return  # the thread is still held by the store: its records are lost, not the run
        try:
            # A window the run ended before was not opened: no record says it was.
            self.windows = [w for w in self.windows if w.request.first_step - self.config.warmup
                            < self.driver._step]
            self._write_due(self.driver._step, all_left=True)
        finally:
            self._pass_lock.release()

    # ---- lines and problems ----------------------------------------------------------------
    def problem(self, message: str) -> None:
        """One line and a manifest `problem`, MAX_PROBLEMS per run; capturing goes on."""
        self._problems += 1
        if self._problems > MAX_PROBLEMS:
            if self._problems == MAX_PROBLEMS + 1:
                say(f"more than {MAX_PROBLEMS} capture problems: the rest are not reported",
                    self.name, self.rank)
            return
        message = shown(message)
        say(message, self.name, self.rank)
        self.write_manifest(schema.TracerProblem(rank=self.rank, t_ns=time.time_ns(),
                                                 part=self.name, message=message))

    def fail_softly(self, message: str) -> None:
        """One line; capturing goes on."""
        say(shown(message), self.name, self.rank)

    # ---- asking ----------------------------------------------------------------------------
    def _judge_steps(self) -> None:
        """The rule on each step that ended since the last pass; a window asked for each
        change it confirms."""
        ends, rule = self._ends, self.rule
        if rule is None:
            return
        if len(ends) >= MAX_PENDING_ENDS:
            self.rule = None
            self.problem(f"the capture thread fell {len(ends)} steps behind the training; the "
                         f"slow-step watch is off")
            return
        fixed, idle, until = self.driver.fixed_action, self.driver._idle, self._fixed_until
        issues, issued, starts = self._first_issues, self._issued, self._starts
        while issues:
            step, issued_ns = issues.popleft()
            issued[step] = issued_ns
        while ends:
            end = ends.popleft()
            step, last = self._next_step, self._last_end
            self._next_step, self._last_end = step + 1, end
            if last is None:
                continue  # its start is not known here; the rule leaves the first steps out
            starts[step] = last
            in_window = (until is None or step <= until) and fixed(step) != idle
            change = rule.observe(step, end - last, in_window)
            if change is not None:
                self._guarded_io("requests", self._request_window, change, end)
        if len(starts) > 2 * STEP_TIMES_KEPT:
            oldest = self._next_step - STEP_TIMES_KEPT
            for kept in (starts, issued):
                for old in [k for k in kept if k < oldest]:
                    del kept[old]
        if self._unsettled:
            self._guarded_io("requests", self._settle)

    def _request_window(self, change: Change, end_ns: int) -> None:
        """Ask every rank for a window after the change this rank's steps took."""
        c = self.config
        now = max(self.driver._step, change.confirmed_step + 1)
        # The pace since the change was confirmed, or the change's own: the faster, the more
        # steps the margin takes.
        since, elapsed = now - change.confirmed_step - 1, time.time_ns() - end_ns
        pace = min(elapsed / since, change.after_ns) if since > 0 else change.after_ns
        first = place_window(now + margin_steps(pace, MARGIN_S) + c.warmup, c.active, c.warmup,
                             self.driver.fixed_action, self.driver._idle)
        if first is None:
            return
        ms = 1e6
        request = schema.CaptureRequest(
            trigger="slow_step", trigger_step=change.step, first_step=first, steps=c.active,
            t_ns=time.time_ns(), trigger_rank=self.rank, ratio=round(change.ratio, 3),
            run=self.run_name, change=schema.RankChange(
                rank=self.rank, step=change.step, confirmed_step=change.confirmed_step,
                factor=round(change.factor, 3), before_ms=round(change.before_ns / ms, 3),
                after_ms=round(change.after_ns / ms, 3)))
        settled = self._with_sync(request)
        self.log.append(settled or request)
        if settled is None and self._first_issues is not None:
            self._unsettled.append((request, time.monotonic() + EVIDENCE_WAIT_S))

    def _with_sync(self, request: schema.CaptureRequest) -> schema.CaptureRequest | None:
        """`request` with its change's times to the first collective, once both are known."""
        change = request.change
        before = self._sync_ms(change.step - HISTORY, change.step)
        after = self._sync_ms(change.step, change.confirmed_step + 1)
        if before is None or after is None:
            return None
        return msgspec.structs.replace(request, t_ns=time.time_ns(), change=msgspec.structs
                                       .replace(change, sync_before_ms=before,
                                                sync_after_ms=after))

    def _settle(self) -> None:
        """Ask again, with the times to the first collective, for each change whose times have
        come since: the same slowdown, so the same window; its record takes them."""
        waiting = []
        for request, until in self._unsettled:
            settled = self._with_sync(request)
            if settled is not None:
                self.log.append(settled)
            elif time.monotonic() < until:
                waiting.append((request, until))
        self._unsettled = waiting

    def _sync_ms(self, first: int, end: int) -> float | None:
        """The median time from a step's start to its first collective over steps first..end-1
        (those whose times are known), in ms; None without any."""
        starts, issued = self._starts, self._issued
        spans = sorted(issued[k] - starts[k] for k in range(max(first, 0), end)
                       if k in issued and k in starts and issued[k] >= starts[k])
        return round(spans[len(spans) // 2] / 1e6, 3) if spans else None

    def _answer_asks(self) -> None:
        """Turn each new python -m tracer.capture ask into a request from this rank's step, if
        this rank is the one that answers it."""
        for number, ask in self.asks.read_new():
            if self.store is not None:
                if not self.store.claim(number):
                    continue
            elif self.rank != 0:
                continue
            steps = self._ask_steps(number, ask)
            if steps is None:
                continue
            c = self.config
            now = self.driver._step
            first = place_window(now + margin_steps(self.pace_ns, ON_DEMAND_MARGIN_S) + c.warmup,
                                 steps, c.warmup, self.driver.fixed_action, self.driver._idle)
            if first is None:
                self.problem(f"capture ask {number}: the profiler's own windows leave no room "
                             f"for another; it is ignored")
                continue
            request = schema.CaptureRequest(
                trigger="on_demand", trigger_step=now, first_step=first, steps=steps,
                t_ns=time.time_ns(), ask=number, run=self.run_name,
                asked_steps=ask.steps if ask.steps > steps else None)
            self.log.append(request)
            if self.store is not None:  # where python -m tracer.capture reads the answer
                self.files.append(request)

    def _ask_steps(self, number: int, ask: schema.CaptureAsk | None) -> int | None:
        """The steps ask `number` gets (clipped to --max-window-steps); None, said, when it is
        ignored."""
        c = self.config
        why = ""
        if ask is None:
            why = "cannot be read (not a CaptureAsk JSON object of at most 64 KiB)"
        elif ask.run and ask.run != self.run_name:
            why = f"is for run {ask.run[:80]!r}, not this one ({self.run_name!r})"
        elif ask.steps < 0:
            why = f"asks for {ask.steps} steps"
        else:
            why = self._dated_elsewhere(ask.t_ns)
        if why:
            self.problem(f"capture ask {number} {why}: ignored")
            return None
        steps = ask.steps or c.active
        if steps > c.max_window_steps:
            self.problem(f"capture ask {number} asks for {steps} steps: clipped to "
                         f"--max-window-steps {c.max_window_steps}")
            steps = c.max_window_steps
        return steps

    def _dated_elsewhere(self, t_ns: int) -> str:
        if t_ns < self.start_ns - CLOCK_SLACK_NS:
            return "was written before this run started"
        if t_ns > time.time_ns() + CLOCK_SLACK_NS:
            return "is dated in the future"
        return ""

    # ---- the list every rank reads alike ------------------------------------------------------
    def _read_log(self) -> None:
        for number, request in self.log.read_new():
            why = self._foreign(request)
            if why:
                # Every rank reads the same list: rank 0 says it for all.
                if self.rank == 0:
                    self.problem(f"capture request {number} {why}: ignored")
                continue
            self._decide(request)

    def _foreign(self, request: schema.CaptureRequest | None) -> str:
        """Why `request` is not one of this run's ranks' ("" when it is)."""
        if request is None:
            return "cannot be read (not a CaptureRequest JSON object of at most 64 KiB)"
        if request.run != self.run_name:
            return f"is of run {request.run[:80]!r}, not this one ({self.run_name!r})"
        if request.trigger not in schema.CAPTURE_TRIGGERS:
            return f"has an unknown trigger {request.trigger[:40]!r}"
        if abs(request.trigger_step - self.driver._step) > MAX_LEAD_STEPS:
            return (f"was asked at step {request.trigger_step}, more than {MAX_LEAD_STEPS} "
                    f"steps from this rank's {self.driver._step}")
        return self._dated_elsewhere(request.t_ns)

    def _decide(self, request: schema.CaptureRequest) -> None:
        change = request.change
        decision = self.plan.decide(request.trigger, request.trigger_step, request.first_step,
                                    request.steps, change.factor if change else None)
        if not decision.accepted:
            same = self._same_slowdown(request)
            if same is not None:
                same.contenders.append(request)
            elif request.trigger == "on_demand" and self.rank == 0:
                self.problem(f"the window of steps {_steps(request)} asked on demand is not "
                             f"opened: {decision.why}")
            return
        if self.rule is not None:
            self.rule.note_window(request.first_step - self.config.warmup,
                                  request.first_step + request.steps - 1)
        planned = self.driver.plan_window(request.first_step, request.steps)
        self.windows.append(_Window(request, planned))
        if not planned and not self.driver.stopped:  # once stopped, the run is ending: no miss
            self.fail_softly(f"the window of steps {_steps(request)} ({request.trigger}) came "
                             f"when this rank was at step {self.driver._step}, past its start (or "
                             f"after the profiler stopped): no trace of it here")

    def _same_slowdown(self, request: schema.CaptureRequest) -> _Window | None:
        """The slow-step window of the slowdown a rejected slow-step request also saw: the
        latest whose change began within the cool-down of the request's (a peer that waits for
        the slow rank); None for another slowdown or an on-demand request."""
        if request.trigger != "slow_step":
            return None
        for window in reversed(self.windows):
            seen = window.request
            if (seen.trigger == "slow_step"
                    and abs(request.trigger_step - seen.trigger_step) <= self.plan.cooldown):
                return window
        return None

    # ---- the records ---------------------------------------------------------------------
    def _write_due(self, step: int, all_left: bool = False) -> None:
        cuts = self.driver.take_cuts()
        for window in self.windows:
            request = window.request
            cut = cuts.get(request.first_step)
            if cut is not None:
                window.cut = cut
            # Once it has closed, and every rank has had the time to ask again with its change's
            # times to the first collective (or the run ends).
            closed = step > request.first_step + request.steps and (
                request.trigger != "slow_step"
                or time.monotonic() - window.decided_s >= self.evidence_wait_s)
            if window.written or not (all_left or closed):
                continue
            window.written = True
            self.write_manifest(self._record(window))

    def _record(self, window: _Window) -> schema.CaptureRecord:
        request = window.request
        missed = not window.planned
        self.captures += not missed
        record = schema.CaptureRecord(
            rank=self.rank, t_ns=time.time_ns(), trigger=request.trigger,
            trigger_step=request.trigger_step, first_step=request.first_step,
            steps=request.steps, missed=missed, asked_steps=request.asked_steps)
        if window.cut is not None and not missed:
            record.cut, record.cut_step = window.cut
        if request.trigger == "slow_step":
            first = window.requests()[0]
            change = first.change
            record.trigger_step, record.trigger_rank = first.trigger_step, first.trigger_rank
            record.ratio = first.ratio
            record.ranks = window.ranks()
            record.late_rank, record.waiting_ranks = _late_and_waiting(record.ranks)
            if change is not None:
                record.factor, record.before_ms = change.factor, change.before_ms
                record.after_ms, record.confirmed_step = change.after_ms, change.confirmed_step
        return record

    def _say_missed(self) -> None:
        for first in self.driver.take_missed():
            for window in self.windows:
                if window.request.first_step == first and window.planned:
                    window.planned = False
                    self.fail_softly(f"the window from step {first} was planned when this rank "
                                     f"was already past its start: no trace of it here")


def _late_and_waiting(ranks: list[schema.RankChange]) -> tuple[int | None, list[int]]:
    """The rank that slowed before its first collective (the earliest change, then the
    largest growth there), and the ranks whose change came after theirs."""
    slowed = [c for c in ranks if c.slowed_itself]
    late = min(slowed, key=lambda c: (c.step, -(c.sync_after_ms - c.sync_before_ms), c.rank),
               default=None)
    return (late.rank if late else None,
            sorted(c.rank for c in ranks if c.slowed_itself is False))


def _steps(request: schema.CaptureRequest) -> str:
    return f"{request.first_step}-{request.first_step + request.steps - 1}"
