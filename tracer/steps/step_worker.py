"""The step-end worker thread: everything about a step that can wait a fraction of a second.

Draining the comms recorder and writing step records and scalars costs about 175 us of CPU per
step when done one step at a time (cold caches, a thread wake-up each); done every PERIOD_S for
all the steps since, about 50 us, and mostly while the main thread waits in C (kernels,
collectives). The session makes the last pass itself, after the comms recorder's last drain.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

PERIOD_S = 0.2  # how often step records, comms records and scalars are written


class StepWorker:
    def __init__(self, write_pending: Callable[[bool], None],
                 on_error: Callable[[BaseException], None]):
        """`write_pending(drain)` writes what piled up; `on_error(exc)` when it raised (the
        worker then stops)."""
        self.records: collections.deque = collections.deque()  # step records not yet written
        self._write_pending = write_pending
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ranktrace-steps", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            try:
                self._write_pending(True)
            except Exception as exc:  # a bug of ours: keep training, stop this part
                self._on_error(exc)
                return
