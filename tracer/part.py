"""The interface every part of the tracer has, and its one failure path.

A part (the profiler driver, the device sampler, the memory readers, the TensorBoard writer, the
record writers, the comms recorder) starts, closes, says how many bytes it wrote, and fails at
most once: `fail(message)` keeps the message in `error`, prints one `ranktrace:` line and tells
its listener (the session, which notes it in the manifest and stops using the part). A failed
part does nothing more; training goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tracer.log import say

_fail_lock = threading.Lock()  # two threads failing one part at once still report it once


class Part:
    name = "part"  # what its stderr line and manifest error are labelled with
    error: str | None = None
    bytes_written: int = 0
    rank: int | None = None  # named in its line; None: the rank the log names
    on_failure: Callable[[Part], None] | None = None  # set by the session

    @property
    def failed(self) -> bool:
        return self.error is not None

    def start(self) -> None:
        """Begin recording (most parts are running once built)."""

    def close(self) -> None:
        """Stop and finish this part's files; calling it again does nothing."""

    def fail(self, message: str) -> bool:
        """Report this part's first failure; False (and nothing said) if it had already failed."""
        with _fail_lock:
            if self.error is not None:
                return False
            self.error = message
        say(message, self.name, self.rank)
        listener = self.on_failure
        if listener is not None:
            listener(self)
        return True
