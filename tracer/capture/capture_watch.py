"""Windows off the profiler's fixed schedule, at the same steps on every rank (docs/tracer.md,
Capturing slow steps).

`CaptureWatch` reads the ordered list of capture requests (tracer.capture.capture_requests) on
each pass of the step-end worker, decides with tracer.capture.slow_steps.CapturePlan which it
opens, and plans each in the profiler driver, which opens it on the training thread at its step;
`SlowStepWatch` also judges this rank's step times (--capture-slow-steps) and asks for a window
when one is slow.
Nothing here runs on the training thread. Each window is noted in the manifest (CaptureRecord)
once it has closed; a rank that learnt of it too late says so.
"""

from __future__ import annotations

import time

from tracer import schema
from tracer.capture.capture_requests import FileLog, StoreLog
from tracer.capture.slow_steps import (
    ON_DEMAND_MARGIN_S,
    CapturePlan,
    SlowStepRule,
    margin_steps,
    place_window,
)
from tracer.parts.part import Part


def open_capture(setup, driver) -> Part | None:
    """The capture watcher of the profiler driver `driver` (built by tracer.probes.profiler)."""
    c = setup.config
    if c.capture_slow_steps:
        return setup.build(SlowStepWatch, c, setup.launch, setup.run_dir, driver,
                           setup.write_manifest)
    return setup.build(CaptureWatch, c, setup.launch, setup.run_dir, driver,
                       setup.write_manifest)


class _Window:
    def __init__(self, request: schema.CaptureRequest, planned: bool):
        self.request = request
        self.planned = planned
        self.contenders: list[schema.CaptureRequest] = []  # later slow-step requests it covers
        self.written = False

    def trigger(self) -> schema.CaptureRequest:
        """The request named as its trigger: of the slow-step requests of one slowdown, the one
        whose step was earliest (the rank that slowed first), then the highest ratio, then the
        lowest rank; the same on every rank, which all read the same requests."""
        if self.request.trigger != "slow_step" or not self.contenders:
            return self.request
        return min([self.request, *self.contenders],
                   key=lambda r: (r.trigger_step, -(r.ratio or 0.0), r.trigger_rank or 0))


class CaptureWatch(Part):
    name = "capture"

    def __init__(self, config, launch, run_dir: str, driver, write_manifest):
        self.config = config
        self.launch = launch
        self.rank = launch.rank
        self.driver = driver
        self.write_manifest = write_manifest
        self.files = FileLog(run_dir)
        self.asks = FileLog(run_dir, schema.CAPTURE_ASK_FILE, schema.CaptureAsk)
        self.store: StoreLog | None = None
        self.log: FileLog | StoreLog = self.files
        self._seen: tuple[int, int] | None = None  # (time_ns, step) at the last pass
        self.pace_ns: float | None = None  # time per step over the last pass that saw steps end
        self.plan = CapturePlan(config.max_captures, config.warmup + config.active,
                                config.warmup)
        self.windows: list[_Window] = []
        self.captures = 0  # windows this rank opened

    def on_worker_pass(self) -> None:
        now, step = time.time_ns(), self.driver._step
        if self._seen is not None and step > self._seen[1]:
            self.pace_ns = (now - self._seen[0]) / (step - self._seen[1])
        self._seen = (now, step)
        self._answer_asks()
        self._read_log()
        self._say_missed()
        self._write_due(self.driver._step)

    def _answer_asks(self) -> None:
        """Turn each new python -m tracer.capture ask into a request from this rank's step, if
        this rank is the one that answers it."""
        for number, ask in self.asks.read_new():
            if self.store is not None:
                if not self.store.claim(number):
                    continue
            elif self.rank != 0:
                continue
            if ask is None or ask.steps < 0:
                self.fail_softly(f"capture ask {number} cannot be read; it is left out")
                continue
            c = self.config
            now, steps = self.driver._step, ask.steps or c.active
            first = place_window(now + margin_steps(self.pace_ns, ON_DEMAND_MARGIN_S) + c.warmup,
                                 steps, c.warmup, self.driver.fixed_action, self.driver._idle)
            if first is None:
                self.fail_softly(f"capture ask {number}: the profiler's own windows leave no "
                                 f"room for another; it is left out")
                continue
            request = schema.CaptureRequest(trigger="on_demand", trigger_step=now,
                                            first_step=first, steps=steps,
                                            t_ns=time.time_ns(), ask=number)
            self.log.append(request)
            if self.store is not None:  # where python -m tracer.capture reads the answer
                self.files.append(request)

    def _read_log(self) -> None:
        for number, request in self.log.read_new():
            if request is None:
                self.fail(f"capture request {number} cannot be read; capturing is off")
                return
            self._decide(request)

    def _decide(self, request: schema.CaptureRequest) -> None:
        decision = self.plan.decide(request.trigger, request.first_step, request.steps)
        if not decision.accepted:
            same = self._same_slowdown(request)
            if same is not None:
                same.contenders.append(request)
            elif request.trigger == "on_demand":
                self.fail_softly(f"the window of steps {_steps(request)} asked on demand is not "
                                 f"opened: {decision.why}")
            return
        self.note_window(request)
        planned = self.driver.plan_window(request.first_step, request.steps)
        self.windows.append(_Window(request, planned))
        if not planned and not self.driver.stopped:  # once stopped, the run is ending: no miss
            self.fail_softly(f"the window of steps {_steps(request)} ({request.trigger}) came "
                             f"when this rank was at step {self.driver._step}, past its start (or "
                             f"after the profiler stopped): no trace of it here")

    def _same_slowdown(self, request: schema.CaptureRequest) -> _Window | None:
        """The slow-step window of the slowdown a rejected slow-step request also saw: the
        latest whose slow step is within the cool-down of the request's (a peer that waited
        for the slow rank, a pass later); None for another slowdown or an on-demand request."""
        if request.trigger != "slow_step":
            return None
        for window in reversed(self.windows):
            seen = window.request
            if (seen.trigger == "slow_step"
                    and abs(request.trigger_step - seen.trigger_step) <= self.plan.cooldown):
                return window
        return None

    def note_window(self, request: schema.CaptureRequest) -> None:
        """A window is opened: what the slow-step rule must know."""

    def fail_softly(self, message: str) -> None:
        """One line; capturing goes on."""
        from tracer.parts.log import say

        say(message, self.name, self.rank)

    def _write_due(self, step: int, all_left: bool = False) -> None:
        for window in self.windows:
            request = window.request
            # Once it has closed: by then every rank has read the other slow-step requests of the
            # same slowdown (window.trigger()).
            if window.written or not (all_left or step > request.first_step + request.steps):
                continue
            window.written = True
            trigger = window.trigger()
            missed = not window.planned
            self.captures += not missed
            self.write_manifest(schema.CaptureRecord(
                rank=self.rank, t_ns=time.time_ns(), trigger=request.trigger,
                trigger_step=trigger.trigger_step, first_step=request.first_step,
                steps=request.steps, trigger_rank=trigger.trigger_rank, ratio=trigger.ratio,
                missed=missed))

    def _say_missed(self) -> None:
        for first in self.driver.take_missed():
            for window in self.windows:
                if window.request.first_step == first and window.planned:
                    window.planned = False
                    self.fail_softly(f"the window from step {first} was planned when this rank "
                                     f"was already past its start: no trace of it here")

    def after_last_records(self, on_main: bool) -> None:
        # A window the run ended before was not opened: no record says it was.
        self.windows = [w for w in self.windows if w.request.first_step - self.config.warmup
                        < self.driver._step]
        self._write_due(self.driver._step, all_left=True)


class SlowStepWatch(CaptureWatch):
    """Also asks every rank for a window when this rank's step is slow (--capture-slow-steps)."""

    def __init__(self, config, launch, run_dir: str, driver, write_manifest):
        super().__init__(config, launch, run_dir, driver, write_manifest)
        self.rule = SlowStepRule(config.capture_slow_steps, config.max_captures,
                                 config.warmup + config.active)
        self._connected = launch.world_size <= 1 or not (
            launch.agent_store and launch.master_addr and launch.master_port)

    def on_worker_pass(self) -> None:
        if not self._connected:  # here, off the training thread, on the first pass
            self._connected = True
            try:
                self.store = self.log = StoreLog.connect(self.launch)
            except Exception as exc:
                self.fail_softly(f"cannot reach torchrun's store ({type(exc).__name__}: {exc}); "
                                 f"ranks agree on windows through files in the run folder")
        super().on_worker_pass()

    def on_step_record(self, record, notes: dict) -> None:
        found = self.rule.observe(record.step, record.end_ns - record.start_ns,
                                  record.in_profiler_window)
        if found is None:
            return
        c = self.config
        now = max(self.driver._step, record.step + 1)
        # The pace since the slow step (the steps that followed it, or the slow step itself).
        since, elapsed = now - record.step - 1, time.time_ns() - record.end_ns
        pace = elapsed / since if since > 0 else record.end_ns - record.start_ns
        first = place_window(now + margin_steps(pace) + c.warmup, c.active,
                             c.warmup, self.driver.fixed_action, self.driver._idle)
        if first is None:
            return
        self.log.append(schema.CaptureRequest(
            trigger="slow_step", trigger_step=record.step, first_step=first, steps=c.active,
            t_ns=time.time_ns(), trigger_rank=self.rank, ratio=round(found.ratio, 3)))
        self._read_log()  # this rank plans it at once; the others on their next pass

    def note_window(self, request: schema.CaptureRequest) -> None:
        self.rule.note_window(request.first_step, request.first_step + request.steps - 1)


def _steps(request: schema.CaptureRequest) -> str:
    return f"{request.first_step}-{request.first_step + request.steps - 1}"
