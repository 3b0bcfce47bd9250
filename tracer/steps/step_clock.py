"""Where a training step ends: at the script's optimizer step, or at its tracer.step() calls.

docs/tracer.md, Steps: with several optimizers the first one that ever stepped keeps time; from
the first tracer.step() call on only tracer.step() ends steps, and a first call that follows an
optimizer step marks that same step instead of a new one.
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Callable

import tracer


class StepClock:
    def __init__(self, on_step_end: Callable[[int, int, int], None]):
        """`on_step_end(step, start_ns, end_ns)` runs on the training thread at each step end."""
        self.on_step_end = on_step_end
        self.steps = 0
        self.start_ns = time.time_ns()
        # The process's CPU time (every thread) at start_ns: a step's own CPU time leaves out
        # the tracer's work at the step end before it (a trace export takes hundreds of ms).
        self.start_cpu_ns = time.process_time_ns()
        # The end time of each step, in order, into one deque per part that asked for them
        # (track_ends): for parts that place what they learn later in its step
        # (tracer.comms.flight) or judge step times off the training thread
        # (tracer.capture.capture_watch); each takes from the left of its own; appended on the
        # training thread, where a deque's append is atomic.
        self._end_queues: tuple[collections.deque, ...] = ()
        self._manual = False
        self._optimizer_ended_a_step = False
        self._step_optimizer: weakref.ref | None = None
        self._hook = None

    def start(self, manual_step: Callable[[], None]) -> None:
        """Hook torch.optim's global step hook; `manual_step` becomes tracer.step()."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        tracer._step_callback = manual_step
        self.start_ns = time.time_ns()
        self.start_cpu_ns = time.process_time_ns()

    def track_ends(self, maxlen: int | None = None) -> collections.deque:
        """A deque of its own that receives every step's end time from now on (holding the
        last `maxlen` at most, for a reader that may stop reading)."""
        ends: collections.deque = collections.deque(maxlen=maxlen)
        self._end_queues = (*self._end_queues, ends)
        return ends

    def close(self) -> None:
        tracer._step_callback = None
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self._manual:
            return
        first = self._step_optimizer() if self._step_optimizer is not None else None
        if first is None:
            self._step_optimizer = weakref.ref(optimizer)
        elif first is not optimizer:
            return
        self._optimizer_ended_a_step = True
        self.end_step()

    def manual_step(self) -> None:
        """tracer.step(): from its first call on, only it ends steps (see the module's doc)."""
        if not self._manual:
            self._manual = True
            if self._optimizer_ended_a_step:
                return
        self.end_step()

    def end_step(self) -> None:
        step, start_ns = self.steps, self.start_ns
        end_ns = time.time_ns()
        self.steps = step + 1
        for ends in self._end_queues:
            ends.append(end_ns)
        try:
            self.on_step_end(step, start_ns, end_ns)
        finally:
            self.start_ns = time.time_ns()
            self.start_cpu_ns = time.process_time_ns()
