"""A daemon thread that does one piece of work every few tenths of a second, off the training
thread: the step-end worker's pass (tracer.steps.step_worker), the capture watch's
(tracer.capture.capture_watch)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class PeriodicThread:
    def __init__(self, name: str, period_s: float, work: Callable[[], None],
                 on_error: Callable[[BaseException], None]):
        """`work()` every `period_s` once started; `on_error(exc)` when it raised (the thread
        then ends)."""
        self.name = name
        self.period_s = period_s
        self._work = work
        self._on_error = on_error
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Ask it to end and wait `timeout` s at most (not when called from the thread
        itself); it is left behind, a daemon, if its work holds it longer."""
        thread, self.thread = self.thread, None
        if thread is None:
            return
        self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._work()
            except Exception as exc:  # a bug of ours: keep training, stop this work
                self._on_error(exc)
                return
