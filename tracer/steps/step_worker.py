"""The step-end worker thread: everything about a step that can wait a fraction of a second.

Draining the comms recorder and writing step records and scalars costs about 175 us of CPU per
step when done one step at a time (cold caches, a thread wake-up each); done every PERIOD_S for
all the steps since, about 50 us, and mostly while the main thread waits in C (kernels,
collectives). The session makes the last pass itself, after the comms recorder's last drain.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from tracer.parts.periodic import PeriodicThread

PERIOD_S = 0.2  # how often step records, comms records and scalars are written


class StepWorker:
    def __init__(self, write_pending: Callable[[bool], None],
                 on_error: Callable[[BaseException], None]):
        """`write_pending(drain)` writes what piled up; `on_error(exc)` when it raised (the
        worker then stops)."""
        self.records: collections.deque = collections.deque()  # step records not yet written
        self._thread = PeriodicThread("ranktrace-steps", PERIOD_S,
                                      lambda: write_pending(True), on_error)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._thread.stop(timeout)
